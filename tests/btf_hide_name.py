#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Copy a raw BTF file with one name hidden: btf_hide_name.py IN OUT NAME.

Every occurrence of NAME in the BTF string section is overwritten in place with a name of the same
length that no kernel has (the last characters become 'x'), so every offset stays valid and the
types are unchanged but for that one name. Used by the loader tests to make a kernel BTF "without"
an enum value (BPF_FUNC_get_current_task_btf): what a 5.10 kernel's BTF looks like to the
bpf_core_enum_value_exists() relocation and to the loader, on a kernel that has the helper.
Exit 1 if NAME is not in the string section (nothing to hide: the test would prove nothing)."""
import struct
import sys


def hide(data: bytes, name: str) -> bytes:
    magic, version, flags, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", data)
    if magic != 0xEB9F:
        raise ValueError("not raw BTF (bad magic)")
    start = hdr_len + str_off
    strings = bytearray(data[start:start + str_len])
    needle = name.encode() + b"\0"
    hidden = (name[:-3] + "xxx").encode() + b"\0"
    count, pos = 0, 0
    while True:
        i = strings.find(needle, pos)
        if i < 0:
            break
        if i == 0 or strings[i - 1] == 0:  # a whole string, not the tail of a longer one
            strings[i:i + len(needle)] = hidden
            count += 1
        pos = i + 1
    if count == 0:
        raise LookupError(f"{name} is not a string of this BTF")
    return data[:start] + bytes(strings) + data[start + str_len:]


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    try:
        out = hide(data, sys.argv[3])
    except (ValueError, LookupError) as e:
        print(f"btf_hide_name: {e}", file=sys.stderr)
        sys.exit(1)
    with open(sys.argv[2], "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main()
