// SPDX-License-Identifier: Apache-2.0
// The systemd notify protocol (sd_notify(3)), self-contained: one datagram to
// $NOTIFY_SOCKET. A no-op when not started by systemd with Type=notify.
#pragma once

#include <cstdint>
#include <string>

namespace mergewatch {

// Sends `state` (e.g. "READY=1\nSTATUS=serving"). Returns false if NOTIFY_SOCKET is unset
// or the send failed; callers treat notification as best effort.
bool SdNotify(const std::string& state);

// The watchdog interval systemd asks for ($WATCHDOG_USEC, for this PID), or 0 if none.
uint64_t SdWatchdogUsec();

}  // namespace mergewatch
