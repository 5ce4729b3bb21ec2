// SPDX-License-Identifier: Apache-2.0
#include "topology/queue_watch.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "topology/topology_keeper.h"

namespace mergewatch {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

// A writable copy of the loop fixture tree (symlinks kept), removed at the end.
class SysfsCopy {
 public:
  SysfsCopy() {
    char dir[] = "/tmp/mw-queue-watch-XXXXXX";
    root_ = mkdtemp(dir);
    fs::copy(std::string(MERGEWATCH_FIXTURE_DIR) + "/sysfs/loop", root_,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
  ~SysfsCopy() { fs::remove_all(root_); }
  const std::string& root() const { return root_; }
  void Write(const std::string& rel, const std::string& text) const { std::ofstream(root_ + "/" + rel) << text; }

 private:
  std::string root_;
};

TEST(QueueWatch, SaysWhichSettingChangedSinceTheScan) {
  SysfsCopy sysfs;
  std::vector<std::string> warnings;
  const Topology topology = Topology::Scan(sysfs.root(), &warnings);
  ASSERT_NE(topology.FindByName("loop12"), nullptr);
  ASSERT_EQ(topology.FindByName("loop12")->queue.nomerges, 0);
  QueueWatch watch(sysfs.root());
  watch.Follow(topology);
  EXPECT_GT(watch.watched_devices(), 0u);
  EXPECT_EQ(watch.Changed(topology), "");
  sysfs.Write("devices/virtual/block/loop12/queue/nomerges", "2\n");
  EXPECT_EQ(watch.Changed(topology), "loop12 queue/nomerges 0 -> 2");
  // The same file, read again each time: back to what the scan saw, nothing changed.
  sysfs.Write("devices/virtual/block/loop12/queue/nomerges", "0\n");
  EXPECT_EQ(watch.Changed(topology), "");
  const std::string was = topology.FindByName("loop12")->queue.scheduler;
  sysfs.Write("devices/virtual/block/loop12/queue/scheduler", was == "none" ? "[mq-deadline] none\n" : "mq-deadline [none]\n");
  std::string changed;
  for (int call = 0; call < 5 && changed.empty(); ++call) changed = watch.Changed(topology);
  EXPECT_NE(changed.find("loop12 queue/scheduler " + was + " -> "), std::string::npos) << changed;
}

TEST(QueueWatch, AllButNomergesAreReadEveryFifthCall) {
  SysfsCopy sysfs;
  std::vector<std::string> warnings;
  const Topology topology = Topology::Scan(sysfs.root(), &warnings);
  const uint64_t was = topology.FindByName("loop12")->queue.max_sectors_kb;
  ASSERT_GT(was, 8u);
  QueueWatch watch(sysfs.root());
  watch.Follow(topology);
  EXPECT_EQ(watch.Changed(topology), "");  // the first call reads all four
  sysfs.Write("devices/virtual/block/loop12/queue/max_sectors_kb", "8\n");
  int calls = 1;
  while (watch.Changed(topology).empty() && calls < 10) ++calls;
  EXPECT_EQ(calls, 5);
}

TEST(QueueWatch, ADeviceTheScanNoLongerShowsIsLetGo) {
  SysfsCopy sysfs;
  std::vector<std::string> warnings;
  const Topology before = Topology::Scan(sysfs.root(), &warnings);
  QueueWatch watch(sysfs.root());
  watch.Follow(before);
  const size_t devices = watch.watched_devices();
  for (const char* link : {"/block/loop12", "/class/block/loop12", "/dev/block/7:12"}) fs::remove(sysfs.root() + link);
  fs::remove_all(sysfs.root() + "/devices/virtual/block/loop12");
  const Topology after = Topology::Scan(sysfs.root(), &warnings);
  ASSERT_EQ(after.FindByName("loop12"), nullptr);
  watch.Follow(after);
  EXPECT_LT(watch.watched_devices(), devices);
  EXPECT_EQ(watch.Changed(after), "");
}

size_t OpenDescriptors() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++count;
  return count;
}

// Four descriptors per watched disk (its four attributes), given back by the next Follow and the destructor.
TEST(QueueWatch, HoldsFourDescriptorsPerWatchedDiskAndNoMore) {
  SysfsCopy sysfs;
  std::vector<std::string> warnings;
  const Topology topology = Topology::Scan(sysfs.root(), &warnings);
  const size_t before = OpenDescriptors();
  {
    QueueWatch watch(sysfs.root());
    watch.Follow(topology);
    ASSERT_GT(watch.watched_devices(), 1u);
    EXPECT_EQ(OpenDescriptors(), before + 1 + 4 * watch.watched_devices());  // the root's O_PATH and four per disk
    watch.Follow(topology);
    EXPECT_EQ(OpenDescriptors(), before + 1 + 4 * watch.watched_devices());
    watch.Changed(topology);  // read through the held descriptors
    EXPECT_EQ(OpenDescriptors(), before + 1 + 4 * watch.watched_devices());
    QueueWatch only_loop12(sysfs.root(), [](const std::string& name) { return name == "loop12"; });
    only_loop12.Follow(topology);
    EXPECT_EQ(only_loop12.watched_devices(), 1u);
  }
  EXPECT_EQ(OpenDescriptors(), before);
}

// Hostile input: a FIFO where an attribute should be is never opened (it would block the tick).
TEST(QueueWatch, AFifoInsteadOfAnAttributeIsNotWatched) {
  SysfsCopy sysfs;
  const std::string attr = sysfs.root() + "/devices/virtual/block/loop12/queue/rotational";
  fs::remove(attr);
  ASSERT_EQ(mkfifo(attr.c_str(), 0600), 0);
  std::vector<std::string> warnings;
  const Topology topology = Topology::Scan(sysfs.root(), &warnings);
  QueueWatch watch(sysfs.root());
  watch.Follow(topology);
  EXPECT_EQ(watch.Changed(topology), "");
}

TEST(TopologyKeeper, ARuntimeQueueChangeRescansAtTheNextTick) {
  SysfsCopy sysfs;
  TimePoint now{};
  TopologyKeeper keeper(sysfs.root(), seconds(60), [&now] { return now; });
  int scans = 0;
  keeper.OnScan([&scans](std::shared_ptr<const Topology>) { ++scans; });
  keeper.RefreshIfDue(false);
  EXPECT_EQ(scans, 1);
  sysfs.Write("devices/virtual/block/loop12/queue/nomerges", "2\n");
  now += seconds(1);
  keeper.RefreshIfDue(false);
  EXPECT_EQ(scans, 2);
  EXPECT_EQ(keeper.current()->FindByName("loop12")->queue.nomerges, 2);
  keeper.RefreshIfDue(false);
  EXPECT_EQ(scans, 2);  // seen once: the new scan holds it
}

}  // namespace
}  // namespace mergewatch
