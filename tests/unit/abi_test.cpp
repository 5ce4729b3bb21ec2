// SPDX-License-Identifier: Apache-2.0
// The BPF/daemon ABI: bucket math shared by both sides, and the struct sizes both
// compilers see, checked against the skeleton's own maps.
#include <gtest/gtest.h>
#include <linux/types.h>

#include <cstring>
#include <memory>

#include "mergewatch.skel.h"
#include "mergewatch/abi.h"

namespace {

TEST(Log2Ceil, ExactPowersOfTwoStayInTheirBucket) {
  for (unsigned k = 0; k < 63; ++k) {
    const __u64 power = 1ull << k;
    EXPECT_EQ(mw_log2_ceil(power), k) << "2^" << k;
    EXPECT_EQ(mw_log2_ceil(power + 1), k + 1) << "2^" << k << "+1";
    if (k > 1) {
      EXPECT_EQ(mw_log2_ceil(power - 1), k) << "2^" << k << "-1";
    }
  }
  EXPECT_EQ(mw_log2_ceil(0), 0u);
  EXPECT_EQ(mw_log2_ceil(1), 0u);
  EXPECT_EQ(mw_log2_ceil(~0ull), 64u);
}

TEST(HistSlot, RequestSizesLandInTheirLeBucket) {
  auto slot_bound = [](__u64 bytes) -> __u64 {
    return 1ull << (MW_SIZE_MIN_SHIFT + mw_hist_slot(bytes, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS));
  };
  EXPECT_EQ(slot_bound(4096), 4096u);      // one 8-sector request: le="4096", not le="8192"
  EXPECT_EQ(slot_bound(4097), 8192u);
  EXPECT_EQ(slot_bound(512), 512u);
  EXPECT_EQ(slot_bound(0), 512u);          // flushes carry no data: first bucket
  EXPECT_EQ(slot_bound(1), 512u);
  EXPECT_EQ(slot_bound(262144), 262144u);  // 512 sectors
  EXPECT_EQ(slot_bound(1u << 24), 1u << 24);
  EXPECT_EQ(mw_hist_slot(1ull << MW_SIZE_MAX_SHIFT, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS), MW_SIZE_SLOTS - 2u);
  EXPECT_EQ(mw_hist_slot((1ull << MW_SIZE_MAX_SHIFT) + 1, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS),
            MW_SIZE_SLOTS - 1u);  // overflow slot: only +Inf covers it
  EXPECT_EQ(mw_hist_slot(1ull << 40, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS), MW_SIZE_SLOTS - 1u);
}

TEST(HistSlot, LatenciesCoverMicrosecondsToMinutes) {
  EXPECT_EQ(mw_hist_slot(1, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS), 0u);
  EXPECT_EQ(mw_hist_slot(1024, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS), 0u);
  EXPECT_EQ(mw_hist_slot(1025, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS), 1u);
  EXPECT_EQ(mw_hist_slot(1ull << MW_LAT_MAX_SHIFT, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS), MW_LAT_SLOTS - 2u);
  EXPECT_EQ(mw_hist_slot(100ull * 1000000000, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS), MW_LAT_SLOTS - 1u);
}

// Opening (not loading) the skeleton needs no privilege and shows the map layouts the
// BPF compiler produced; they must match what the C++ side reads.
TEST(AbiSizes, MatchTheSkeletonMaps) {
  std::unique_ptr<mergewatch_bpf, decltype(&mergewatch_bpf__destroy)> skel(mergewatch_bpf__open(),
                                                                           &mergewatch_bpf__destroy);
  ASSERT_NE(skel, nullptr);
  EXPECT_EQ(bpf_map__key_size(skel->maps.dev_stats), sizeof(mw_dev_key));
  EXPECT_EQ(bpf_map__value_size(skel->maps.dev_stats), sizeof(mw_dev_stats));
  EXPECT_EQ(bpf_map__key_size(skel->maps.inflight), sizeof(__u32));
  EXPECT_EQ(bpf_map__value_size(skel->maps.inflight), sizeof(mw_inflight));
  EXPECT_EQ(bpf_map__max_entries(skel->maps.event_counts), static_cast<__u32>(MW_CNT_MAX));
  EXPECT_EQ(bpf_map__value_size(skel->maps.event_counts), sizeof(__u64));
  EXPECT_EQ(bpf_map__max_entries(skel->maps.inflight), static_cast<__u32>(MW_DEFAULT_INFLIGHT_ENTRIES));
}

// Where a program counts a key that dev_stats or origin_stats refused to create (-ENOMEM from the
// kernel's BPF allocator on 6.1): the same layouts, read by the same code, and preallocated, so that
// a key made there never needs an allocation that can fail the same way.
TEST(AbiSizes, SpillMapsMatchTheirMainMapsAndArePreallocated) {
  std::unique_ptr<mergewatch_bpf, decltype(&mergewatch_bpf__destroy)> skel(mergewatch_bpf__open(),
                                                                           &mergewatch_bpf__destroy);
  ASSERT_NE(skel, nullptr);
  const struct {
    const bpf_map* spill;
    const bpf_map* main;
  } pairs[] = {{skel->maps.dev_stats_spill, skel->maps.dev_stats}, {skel->maps.origin_spill, skel->maps.origin_stats}};
  for (const auto& p : pairs) {
    SCOPED_TRACE(bpf_map__name(p.spill));
    EXPECT_EQ(bpf_map__type(p.spill), bpf_map__type(p.main));
    EXPECT_EQ(bpf_map__key_size(p.spill), bpf_map__key_size(p.main));
    EXPECT_EQ(bpf_map__value_size(p.spill), bpf_map__value_size(p.main));
    EXPECT_EQ(bpf_map__max_entries(p.spill), static_cast<__u32>(MW_SPILL_KEYS));
    EXPECT_EQ(bpf_map__map_flags(p.spill) & BPF_F_NO_PREALLOC, 0u);
    EXPECT_NE(bpf_map__map_flags(p.main) & BPF_F_NO_PREALLOC, 0u);
  }
  // The daemon finds them among the loader's descriptors by the kernel's name: 15 characters at most.
  EXPECT_LE(strlen(bpf_map__name(skel->maps.dev_stats_spill)), 15u);
  EXPECT_LE(strlen(bpf_map__name(skel->maps.origin_spill)), 15u);
}

}  // namespace
