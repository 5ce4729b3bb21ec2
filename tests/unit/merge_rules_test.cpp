// SPDX-License-Identifier: Apache-2.0
// The kernel's back-merge decision as the BPF programs take it (include/mergewatch/merge_rules.h):
// one test per rule of blk_rq_merge_ok() / blk_try_merge() / ll_back_merge_fn().
#include <gtest/gtest.h>
#include <algorithm>
#include <map>
#include <vector>
#include <linux/types.h>

#include "mergewatch/merge_rules.h"

namespace {

// A 4 KiB read at `sector` from a page-aligned buffer, as fio/O_DIRECT submits it.
mw_merge_side Read4k(__u64 sector) {
  mw_merge_side s{};
  s.sector = sector;
  s.sectors = 8;
  s.segments = 1;
  s.op = MW_OP_READ;
  s.first_offset = 0;
  s.last_end = 4096;
  return s;
}

// A loop device's limits (1280 KiB, 128 segments), no chunks, no virt boundary.
mw_merge_limits LoopLimits() {
  mw_merge_limits l{};
  l.max_sectors = 2560;
  l.max_discard_sectors = 8;
  l.max_write_zeroes_sectors = 8;
  l.max_segments = 128;
  l.max_discard_segments = 1;
  return l;
}

int Verdict(const mw_merge_side& rq, const mw_merge_side& bio, const mw_merge_limits& lim = LoopLimits()) {
  return mw_back_merge_verdict(&rq, &bio, &lim);
}

TEST(MergeRules, ContiguousSameKindBiosMerge) {
  EXPECT_EQ(Verdict(Read4k(0), Read4k(8)), MW_MERGE_OK);
}

TEST(MergeRules, OnlyBackMergesOfContiguousSectors) {
  EXPECT_EQ(Verdict(Read4k(0), Read4k(16)), MW_MERGE_NOT_CONTIGUOUS);  // a hole
  EXPECT_EQ(Verdict(Read4k(8), Read4k(0)), MW_MERGE_NOT_CONTIGUOUS);   // a front merge: not a back merge
  EXPECT_EQ(Verdict(Read4k(0), Read4k(4)), MW_MERGE_NOT_CONTIGUOUS);   // overlap
}

TEST(MergeRules, FlushWriteZeroesZoneAppendAndPassthroughNeverMerge) {
  // REQ_OP_ZONE_APPEND was 13 and is 7 since enum req_op was renumbered: whichever the kernel has,
  // an op the rules do not list never merges.
  for (__u32 op : {MW_OP_FLUSH, MW_OP_WRITE_ZEROES, 7u, 13u, MW_OP_DRV_IN, MW_OP_DRV_OUT}) {
    mw_merge_side rq = Read4k(0), bio = Read4k(8);
    rq.op = bio.op = op;
    EXPECT_EQ(Verdict(rq, bio), MW_MERGE_OP_NOT_MERGEABLE) << op;
  }
  EXPECT_TRUE(mw_op_is_passthrough(MW_OP_DRV_IN));
  EXPECT_FALSE(mw_op_is_passthrough(MW_OP_WRITE));
}

// REQ_NOMERGE_FLAGS: the O_DSYNC case (FUA bios), PREFLUSH, and REQ_NOMERGE of block-layer splits,
// on either side.
TEST(MergeRules, NomergeFlagsRefuseOnEitherSide) {
  for (__u32 flag : {MW_F_FUA, MW_F_PREFLUSH, MW_F_NOMERGE}) {
    mw_merge_side rq = Read4k(0), bio = Read4k(8);
    rq.op = bio.op = MW_OP_WRITE;
    bio.flags = flag;
    EXPECT_EQ(Verdict(rq, bio), MW_MERGE_NOMERGE_FLAGS) << flag;
    bio.flags = 0;
    rq.flags = flag;
    EXPECT_EQ(Verdict(rq, bio), MW_MERGE_NOMERGE_FLAGS) << flag;
  }
}

TEST(MergeRules, DifferentOpOrDirectionRefuses) {
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  bio.op = MW_OP_WRITE;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_OP_DIFFERS);
}

TEST(MergeRules, DifferentCgroupOrRootIssueRefuses) {
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  rq.blkg = 0x1000;
  bio.blkg = 0x2000;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_CGROUP);
  bio.blkg = 0x1000;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_OK);
  bio.flags = MW_F_META;  // bio_issue_as_root_blkg() differs
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_CGROUP);
  rq.flags = MW_F_SWAP;  // both "as root": mergeable again
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_OK);
}

TEST(MergeRules, IntegrityOnEitherSideRefuses) {
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  bio.flags = MW_F_INTEGRITY;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_INTEGRITY);
  rq.flags = MW_F_INTEGRITY;  // both: bip_flags and integrity segments unseen, so not claimed
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_INTEGRITY);
}

TEST(MergeRules, InlineCryptContextRefuses) {
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  rq.flags = MW_F_CRYPT;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_CRYPT);
}

TEST(MergeRules, DifferentWriteHintRefuses) {
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  rq.op = bio.op = MW_OP_WRITE;
  rq.write_hint = 2;  // WRITE_LIFE_SHORT
  bio.write_hint = 3;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_WRITE_HINT);
}

TEST(MergeRules, DifferentIoPriorityRefuses) {
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  bio.ioprio = (2u << 13) | 4;  // IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, 4)
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_IOPRIO);
}

TEST(MergeRules, AtomicWritesAreNotClaimed) {
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  rq.op = bio.op = MW_OP_WRITE;
  bio.flags = MW_F_ATOMIC;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_ATOMIC);
}

TEST(MergeRules, MaxSectorsPerOpBoundsTheMergedRequest) {
  mw_merge_side rq = Read4k(0), bio = Read4k(2552);
  rq.sectors = 2552;  // 1276 KiB so far: one more 4 KiB reaches 1280 KiB exactly
  rq.segments = 100;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_OK);
  bio.sector = rq.sector + (rq.sectors = 2553);
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_MAX_SECTORS);
  // Discards are bounded by max_discard_sectors (and one range per segment).
  mw_merge_limits lim = LoopLimits();
  lim.max_discard_segments = 64;
  mw_merge_side d = Read4k(0), next = Read4k(8);
  d.op = next.op = MW_OP_DISCARD;
  EXPECT_EQ(Verdict(d, next, lim), MW_MERGE_MAX_SECTORS);  // 8 + 8 > 8
  lim.max_discard_sectors = 16;
  EXPECT_EQ(Verdict(d, next, lim), MW_MERGE_OK);
}

TEST(MergeRules, ChunkBoundaryIsNotCrossed) {
  mw_merge_limits lim = LoopLimits();
  lim.chunk_sectors = 256;  // 128 KiB chunks (md raid0, zoned, dm-stripe-like limits)
  mw_merge_side rq = Read4k(240), bio = Read4k(248);
  EXPECT_EQ(Verdict(rq, bio, lim), MW_MERGE_OK);  // ends at 256: still inside the chunk
  rq.sectors = 16;
  bio.sector = 256;
  EXPECT_EQ(Verdict(rq, bio, lim), MW_MERGE_CHUNK);  // 240..264 crosses 256
  EXPECT_EQ(mw_chunk_sectors_left(240, 256), 16u);
  EXPECT_EQ(mw_chunk_sectors_left(250, 100), 50u);  // not a power of two: divided
}

TEST(MergeRules, SegmentLimitCountsDiscardRangesApart) {
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  rq.segments = 128;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_SEGMENTS);
  rq.segments = 127;
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_OK);
  // Single-range discard (max_discard_segments 1): two discard bios are two ranges.
  mw_merge_limits lim = LoopLimits();
  lim.max_discard_sectors = 1024;
  mw_merge_side d = Read4k(0), next = Read4k(8);
  d.op = next.op = MW_OP_DISCARD;
  EXPECT_EQ(Verdict(d, next, lim), MW_MERGE_SEGMENTS);
}

// A multi-page bvec is one bvec but as many segments as max_segment_size cuts it into.
TEST(MergeRules, WholeBioSegmentsCountEachBvecCutByTheMaximumSegmentSize) {
  constexpr uint32_t kLoopMax = 65536;
  EXPECT_EQ(mw_whole_bio_segments(1, 4096, kLoopMax), 1u);      // the collapse's 4 KiB bio
  EXPECT_EQ(mw_whole_bio_segments(1, 65536, kLoopMax), 1u);     // exactly one maximum segment
  EXPECT_EQ(mw_whole_bio_segments(1, 65537, kLoopMax), 2u);
  EXPECT_EQ(mw_whole_bio_segments(1, 1 << 20, kLoopMax), 16u);  // 1 MiB of contiguous pages
  // 256 separate pages are 256 segments; how the bytes fall into bvecs is not read, so the
  // bound is 15 above: it may refuse a merge the kernel makes (a miss not counted), never the reverse.
  EXPECT_EQ(mw_whole_bio_segments(256, 1 << 20, kLoopMax), 271u);
  // Two bvecs of 96 KiB: two segments each.
  EXPECT_EQ(mw_whole_bio_segments(2, 2 * 98304, kLoopMax), 4u);
  EXPECT_EQ(mw_whole_bio_segments(3, 0, kLoopMax), 3u);
  EXPECT_EQ(mw_whole_bio_segments(4, 1 << 20, 0), 4u);  // no maximum known: the bvecs
  // With the limit: a 1 MiB one-bvec request (16 segments) and the next one (16) fit in 128,
  // eight such are 128, a ninth does not.
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  rq.segments = 8 * mw_whole_bio_segments(1, 1 << 20, kLoopMax);
  bio.segments = mw_whole_bio_segments(1, 1 << 20, kLoopMax);
  EXPECT_EQ(Verdict(rq, bio), MW_MERGE_SEGMENTS);
}

TEST(MergeRules, VirtBoundaryGapsRefuse) {
  mw_merge_limits lim = LoopLimits();
  lim.virt_boundary_mask = 4095;  // NVMe: the controller page
  mw_merge_side rq = Read4k(0), bio = Read4k(8);
  EXPECT_EQ(Verdict(rq, bio, lim), MW_MERGE_OK);  // page-aligned both sides
  bio.first_offset = 512;
  EXPECT_EQ(Verdict(rq, bio, lim), MW_MERGE_VIRT_GAP);
  bio.first_offset = 0;
  rq.last_end = 2048;  // the request's data ends mid-page
  EXPECT_EQ(Verdict(rq, bio, lim), MW_MERGE_VIRT_GAP);
  rq.last_end = 4096;
  rq.first_offset = 1024;  // the request starts unaligned (bio_will_gap's first check)
  EXPECT_EQ(Verdict(rq, bio, lim), MW_MERGE_VIRT_GAP);
  rq.first_offset = 0;
  rq.flags = MW_F_OFFSETS_UNKNOWN;  // a request entered without its layout: not claimed
  EXPECT_EQ(Verdict(rq, bio, lim), MW_MERGE_VIRT_GAP);
  lim.virt_boundary_mask = 0;  // no boundary: offsets do not matter
  bio.first_offset = 512;
  EXPECT_EQ(Verdict(rq, bio, lim), MW_MERGE_OK);
}

TEST(MergeRules, AppendBuildsTheRunMergingWouldHaveBuilt) {
  mw_merge_side run = Read4k(0);
  for (int i = 1; i < 64; ++i) {
    mw_merge_side bio = Read4k(8u * i);
    ASSERT_EQ(Verdict(run, bio), MW_MERGE_OK) << i;
    mw_merge_side_append(&run, &bio);
  }
  EXPECT_EQ(run.sectors, 512u);  // 64 x 4 KiB = 256 KiB
  EXPECT_EQ(run.segments, 64u);
  EXPECT_EQ(run.sector, 0u);
}

}  // namespace

// ---- Plug evidence: which request of the task's plug a bio could join (mw_plug_gen_*) ----
namespace {

// The kernel's plug for one task, as block/blk-mq.c and block/blk-merge.c keep it: requests in
// the order they were added, rq_count over every queue, the flush before an add when full
// (BLK_MAX_REQUEST_COUNT: 16 before 5.16, 32 from ba0ffdd8ce48, twice that with multiple queues
// in blk_plug_max_rq_count()) or after a request of BLK_PLUG_FLUSH_SIZE, and a flush from
// schedule() at any time.
struct KernelPlug {
  struct Rq { int queue, id; };
  unsigned limit = 32;
  bool doubles_with_multiple_queues = true;  // 5.16+: blk_plug_max_rq_count()
  std::vector<Rq> list;                      // oldest first
  bool multiple_queues = false;

  __u32 rq_count() const { return static_cast<__u32>(list.size()); }
  void Flush() { list.clear(); multiple_queues = false; }
  void Add(int queue, int id, bool last_was_large = false) {
    const unsigned max = multiple_queues && doubles_with_multiple_queues ? 2 * limit : limit;
    if (!list.empty() && (list.size() >= max || last_was_large)) Flush();
    if (!list.empty() && list.back().queue != queue) multiple_queues = true;
    list.push_back({queue, id});
  }
  // The request blk_attempt_plug_merge() tries, per kernel version; -1: none.
  int NewestOfQueue(int queue) const {  // 6.1-6.12 (LIFO list walked while multiple_queues)
    for (auto it = list.rbegin(); it != list.rend(); ++it) {
      if (it->queue == queue) return it->id;
      if (!multiple_queues) break;
    }
    return -1;
  }
  int OldestOfQueue(int queue) const {  // 6.13-6.15: e70c301faece made the list FIFO, walked from the head
    for (const Rq& r : list) {
      if (r.queue == queue) return r.id;
      if (!multiple_queues) break;
    }
    return -1;
  }
  int TailThenOldestOfQueue(int queue) const {  // the stable fix "use plug request list tail ..."
    if (list.empty()) return -1;
    if (list.back().queue == queue) return list.back().id;
    return multiple_queues ? OldestOfQueue(queue) : -1;
  }
  std::vector<int> AllOfQueue(int queue) const {  // 5.4-5.15: list_for_each_entry_reverse, every one
    std::vector<int> ids;
    for (const Rq& r : list)
      if (r.queue == queue) ids.push_back(r.id);
    return ids;
  }
};

// What the BPF side keeps (handlers.bpf.h missed_merge()): one generation count for the plug, and
// per queue the newest request with its number.
struct PlugEvidence {
  mw_plug_gen gen{};
  std::map<int, std::pair<int, __u64>> newest;  // queue -> (request id, seq)
  __u64 clock = 1000;

  // block_getrq for a request of `queue` while the plug holds `count`: the candidate, -1 if none.
  int Getrq(int queue, int id, __u32 count, bool joins = true) {
    if (gen.plug != 0xffff8000u) mw_plug_gen_start(&gen, 0xffff8000u, clock);
    else mw_plug_gen_observe(&gen, count);
    int candidate = -1;
    auto it = newest.find(queue);
    if (it != newest.end() && mw_plug_gen_holds(&gen, it->second.second)) candidate = it->second.first;
    newest[queue] = {id, mw_plug_gen_add(&gen, count, joins ? 1 : 0)};
    return candidate;
  }
};

}  // namespace

// md RAID0/10 and striped LVs with small chunks: the plug alternates disks, A0 B0 A1. A1's candidate
// is A0, the newest request of its own queue, although the plug grew by two (the rule "exactly one
// more" found none here: 80,072 unmerged 4 KiB requests per member and no missed merge).
TEST(PlugEvidence, APlugOfSeveralQueuesKeepsEachQueuesNewestRequest) {
  KernelPlug plug;
  PlugEvidence seen;
  int id = 0;
  for (int round = 0; round < 8; ++round) {
    for (int queue : {0, 1, 2}) {
      const int want = plug.NewestOfQueue(queue);
      EXPECT_EQ(seen.Getrq(queue, id, plug.rq_count()), want) << "round " << round << " queue " << queue;
      plug.Add(queue, id++);
    }
  }
  EXPECT_TRUE(plug.multiple_queues);
}

// Every version's flush: no limit is a parameter of the rule, so 16 (5.10), 32 (6.1) and 64 (6.1,
// several queues) and the BLK_PLUG_FLUSH_SIZE flush are all followed; after a flush only the request
// whose add flushed is left, and after schedule() flushed the plug nothing is.
TEST(PlugEvidence, FollowsEveryFlushWithoutKnowingTheLimit) {
  for (unsigned limit : {16u, 32u}) {
    for (int queues : {1, 2, 3}) {
      KernelPlug plug;
      plug.limit = limit;
      plug.doubles_with_multiple_queues = limit == 32;
      PlugEvidence seen;
      unsigned limit_flushes = 0;
      for (int id = 0; id < 600; ++id) {
        const int queue = id % queues;
        const bool large = id % 97 == 96;   // the previous request reached 128 KiB
        const bool slept = id % 131 == 130; // schedule() flushed the plug before this getrq
        if (slept) plug.Flush();
        const int want = plug.NewestOfQueue(queue);
        ASSERT_EQ(seen.Getrq(queue, id, plug.rq_count()), want)
            << "limit " << limit << ", " << queues << " queues, request " << id;
        const unsigned capacity = plug.multiple_queues && plug.doubles_with_multiple_queues ? 2 * limit : limit;
        if (plug.list.size() >= capacity) ++limit_flushes;
        plug.Add(queue, id, large);
      }
      EXPECT_GE(limit_flushes, 3u) << "the case must include flushes at the limit";
    }
  }
}

// A PREFLUSH/FUA request goes to blk_insert_flush(), not into the plug: rq_count does not grow, and
// the requests before it are still candidates.
TEST(PlugEvidence, AFlushRequestDoesNotJoinThePlug) {
  PlugEvidence seen;
  EXPECT_EQ(seen.Getrq(0, 0, 0), -1);
  EXPECT_EQ(seen.Getrq(1, 1, 1, /*joins=*/false), -1);  // an fsync's FUA write to another disk
  EXPECT_EQ(seen.Getrq(0, 2, 1), 0);                    // count unchanged: request 0 still there
  // The plug grew by more than the requests seen (a request not seen, a state from another task):
  // nothing is trusted.
  EXPECT_EQ(seen.Getrq(0, 3, 4), -1);
}

// 5.4-5.15 try every request of the bio's queue (and front merges); the newest of the queue, the one
// request tracked here, is always among them: a miss claimed against it is one the kernel would have found.
TEST(PlugEvidence, On5_10TheCandidateIsAmongTheRequestsTheKernelWalks) {
  KernelPlug plug;
  plug.limit = 16;
  plug.doubles_with_multiple_queues = false;
  PlugEvidence seen;
  for (int id = 0; id < 200; ++id) {
    const int queue = (id * 7 + id / 5) % 3;
    const int got = seen.Getrq(queue, id, plug.rq_count());
    const std::vector<int> walked = plug.AllOfQueue(queue);
    if (got >= 0) {
      EXPECT_NE(std::find(walked.begin(), walked.end(), got), walked.end()) << id;
      EXPECT_EQ(got, walked.back()) << id;
    } else {
      EXPECT_TRUE(walked.empty()) << id;
    }
    plug.Add(queue, id);
  }
}

// 6.13 to the stable fix (e70c301faece, "block: don't reorder requests in blk_add_rq_to_plug"): the
// kernel tries the OLDEST request, so a sequential stream merges into its first request only; from the
// second request on, each bio gets a request of its own although it continues the newest one. This
// cannot be told from BTF (the fix changed code only), so the evidence keeps the newest-request rule:
// there every such request counts as a missed merge with nomerges=0, and the page is right (merges
// are lost, ~97% measured in the regression report); the remedy is the kernel update.
TEST(PlugEvidence, On6_13To6_15TheKernelTriesTheOldestRequestAndMissesAreCounted) {
  KernelPlug plug;
  PlugEvidence seen;
  int differs = 0;
  for (int id = 0; id < 10; ++id) {
    const int newest = seen.Getrq(0, id, plug.rq_count());
    const int oldest = plug.OldestOfQueue(0);
    EXPECT_EQ(newest, plug.NewestOfQueue(0));
    EXPECT_EQ(plug.TailThenOldestOfQueue(0), newest);  // after the stable fix: the tail again
    if (newest != oldest) ++differs;
    plug.Add(0, id);
  }
  EXPECT_EQ(differs, 8);  // every request from the third on: newest != oldest
  // With several queues the fixed kernel still takes the oldest request of the bio's queue unless it is
  // the tail; the newest of the queue (tracked) is then a request the kernel does not try.
  KernelPlug multi;
  multi.Add(0, 0);
  multi.Add(0, 1);
  multi.Add(1, 2);
  EXPECT_EQ(multi.TailThenOldestOfQueue(0), 0);
  EXPECT_EQ(multi.NewestOfQueue(0), 1);
}

// A plug's state taken over by another plug and back starts a new count from the clock: the
// queue slot recorded under the old count is never a candidate again.
TEST(PlugEvidence, ARestartedCountNeverAcceptsAnOldRequest) {
  mw_plug_gen gen{};
  mw_plug_gen_start(&gen, 1, 5000);
  const __u64 old = mw_plug_gen_add(&gen, 0, 1);
  mw_plug_gen_observe(&gen, 1);
  EXPECT_TRUE(mw_plug_gen_holds(&gen, old));
  mw_plug_gen_start(&gen, 1, 9000);  // evicted and re-created
  mw_plug_gen_observe(&gen, 2);
  EXPECT_FALSE(mw_plug_gen_holds(&gen, old));
  EXPECT_FALSE(mw_plug_gen_holds(&gen, gen.next_seq));  // not yet made
}
