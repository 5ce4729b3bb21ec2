// SPDX-License-Identifier: Apache-2.0
// The kernel's back-merge decision as the BPF programs take it (include/mergewatch/merge_rules.h):
// one test per rule of blk_rq_merge_ok() / blk_try_merge() / ll_back_merge_fn().
#include <gtest/gtest.h>
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
  for (__u32 op : {MW_OP_FLUSH, MW_OP_WRITE_ZEROES, MW_OP_ZONE_APPEND, MW_OP_DRV_IN, MW_OP_DRV_OUT}) {
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

// blk_add_rq_to_plug(): the request added right after its getrq is the plug's newest while the
// plug holds one more; a request whose add flushed a full plug (32 of one queue) is alone in it.
TEST(MergeRules, PlugStillHoldsTheNewestRequestAcrossTheFullPlugFlush) {
  EXPECT_TRUE(mw_plug_still_holds(0, 1));
  EXPECT_TRUE(mw_plug_still_holds(30, 31));
  EXPECT_TRUE(mw_plug_still_holds(32, 1));   // the 33rd request flushed the first 32
  EXPECT_TRUE(mw_plug_still_holds(40, 1));   // a plug of several queues flushes at 64
  EXPECT_FALSE(mw_plug_still_holds(5, 1));   // flushed (the task slept), then another request
  EXPECT_FALSE(mw_plug_still_holds(5, 7));   // another request came after it
  EXPECT_FALSE(mw_plug_still_holds(5, 5));   // not added: the request left the plug
}
