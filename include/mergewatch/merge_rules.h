/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * Would the kernel back-merge this bio into that request? The decision the block layer
 * takes in blk_rq_merge_ok() + blk_try_merge() + ll_back_merge_fn() (block/blk-merge.c),
 * written once as a pure function so the BPF programs (bpf/handlers.bpf.h) and the unit
 * tests (tests/unit/merge_rules_test.cpp, one test per rule) run the same code.
 *
 * The BPF side fills the two mw_merge_side values from the bio and from the newest
 * request the bio could have joined (the plug's, or the scheduler's), and the limits
 * from request_queue->limits. A "missed merge" is a new request (block_getrq) for which
 * this says MW_MERGE_OK: the kernel could have merged it and did not (nomerges, or a
 * setting that stopped it looking).
 *
 * Where the kernel needs data a tracepoint cannot see cheaply (integrity segments, the
 * inline-crypt DUN, atomic write limits, physical contiguity of bvecs) the rule refuses:
 * a missed merge is only claimed when it is certain, never guessed.
 *
 * Same typing rules as abi.h: fixed-width fields only, no bool in structs.
 */
#ifndef MERGEWATCH_MERGE_RULES_H
#define MERGEWATCH_MERGE_RULES_H

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#include "abi.h" /* MW_OP_* */

/* Passthrough requests (SG_IO, NVMe admin and ioctl commands): REQ_OP_DRV_IN/OUT. */
static __always_inline int mw_op_is_passthrough(__u32 op)
{
	return op == MW_OP_DRV_IN || op == MW_OP_DRV_OUT;
}

/*
 * Request flags the rules look at, renumbered: the kernel's __REQ_* bit positions move
 * between versions, so the BPF side maps them with CO-RE enum relocations
 * (bpf_core_enum_value(enum req_flag_bits, __REQ_FUA)) into these fixed bits.
 */
#define MW_F_NOMERGE (1u << 0)   /* REQ_NOMERGE: block-layer splits and some drivers set it */
#define MW_F_FUA (1u << 1)       /* REQ_FUA */
#define MW_F_PREFLUSH (1u << 2)  /* REQ_PREFLUSH */
#define MW_F_INTEGRITY (1u << 3) /* REQ_INTEGRITY: a bio_integrity_payload is attached */
#define MW_F_META (1u << 4)      /* REQ_META: with REQ_SWAP, bio_issue_as_root_blkg() */
#define MW_F_SWAP (1u << 5)      /* REQ_SWAP */
#define MW_F_ATOMIC (1u << 6)    /* REQ_ATOMIC (v6.11) */
#define MW_F_CRYPT (1u << 7)     /* an inline-encryption context (bi_crypt_context) is attached */
/* Not a kernel flag: where the data sits in its pages was not read (first_offset/last_end are void). */
#define MW_F_OFFSETS_UNKNOWN (1u << 8)
/* REQ_NOMERGE_FLAGS (include/linux/blk_types.h): never merged, in either role. */
#define MW_F_NOMERGE_FLAGS (MW_F_NOMERGE | MW_F_FUA | MW_F_PREFLUSH)

/*
 * One side of a merge: a bio, or the request (run of bios) it could join. For a request
 * the attributes are its first bio's (a request takes them from the bio it was built
 * from, blk_mq_bio_to_request()), sectors/segments are the totals so far, and last_end
 * is its last bio's.
 */
struct mw_merge_side {
	__u64 sector;     /* first sector */
	__u64 blkg;       /* bi_blkg pointer: the cgroup's blkcg_gq; 0 without blk-cgroup */
	__u32 sectors;    /* length in 512-byte sectors */
	__u32 segments;   /* physical segments, or an upper bound of them (see the BPF side) */
	__u32 op;         /* REQ_OP_* */
	__u32 flags;      /* MW_F_* */
	__u32 ioprio;     /* bio_prio() / rq->ioprio */
	__u32 write_hint; /* bi_write_hint / rq->write_hint (v6.9; 0 before) */
	__u32 first_offset; /* byte offset of the first data byte in its first bvec */
	__u32 last_end;     /* offset + length of the last bvec: where the data ends in its page */
};

/* The queue limits that bound a merged request (struct queue_limits). */
struct mw_merge_limits {
	__u64 virt_boundary_mask; /* 0 = none */
	__u32 max_sectors;
	__u32 max_discard_sectors;
	__u32 max_write_zeroes_sectors;
	__u32 chunk_sectors; /* 0 = none */
	__u32 max_segments;
	__u32 max_discard_segments;
};

/* Verdicts: MW_MERGE_OK, or the first kernel rule that refuses the merge. */
#define MW_MERGE_OK 0
#define MW_MERGE_NOT_CONTIGUOUS 1 /* blk_try_merge(): rq end != bio start */
#define MW_MERGE_OP_NOT_MERGEABLE 2 /* rq_mergeable(): flush, write zeroes, zone append, passthrough, ... */
#define MW_MERGE_NOMERGE_FLAGS 3  /* rq_mergeable()/bio_mergeable(): REQ_NOMERGE_FLAGS */
#define MW_MERGE_OP_DIFFERS 4     /* req_op(rq) != bio_op(bio) (and so the data direction) */
#define MW_MERGE_CGROUP 5         /* blk_cgroup_mergeable() */
#define MW_MERGE_INTEGRITY 6      /* blk_integrity_merge_bio() */
#define MW_MERGE_CRYPT 7          /* bio_crypt_rq_ctx_compatible() / bio_crypt_ctx_back_mergeable() */
#define MW_MERGE_WRITE_HINT 8     /* rq->write_hint != bio->bi_write_hint */
#define MW_MERGE_IOPRIO 9         /* rq->ioprio != bio_prio(bio) */
#define MW_MERGE_ATOMIC 10        /* blk_atomic_write_mergeable_rq_bio() */
#define MW_MERGE_MAX_SECTORS 11   /* ll_back_merge_fn(): blk_rq_get_max_sectors() per op */
#define MW_MERGE_CHUNK 12         /* blk_rq_get_max_sectors(): blk_chunk_sectors_left() */
#define MW_MERGE_SEGMENTS 13      /* ll_new_hw_segment(): blk_rq_get_max_segments() */
#define MW_MERGE_VIRT_GAP 14      /* req_gap_back_merge(): bio_will_gap() on the virt boundary */

/* The ops rq_mergeable() lets through that mergewatch models; anything else is refused. */
static __always_inline int mw_op_mergeable(__u32 op)
{
	return op == MW_OP_READ || op == MW_OP_WRITE || op == MW_OP_DISCARD || op == MW_OP_SECURE_ERASE;
}

/* blk_queue_get_max_sectors(): the size limit of a request of this op. */
static __always_inline __u32 mw_max_sectors_for_op(const struct mw_merge_limits *lim, __u32 op)
{
	if (op == MW_OP_DISCARD || op == MW_OP_SECURE_ERASE)
		return lim->max_discard_sectors;
	if (op == MW_OP_WRITE_ZEROES)
		return lim->max_write_zeroes_sectors;
	return lim->max_sectors;
}

/*
 * The physical segments of a bio its submitter built (all of its bi_vcnt bvecs), from above.
 * A bvec covers physically contiguous pages, however many (a multi-page bvec), and the kernel
 * cuts it into pieces of at most max_segment_size when it counts segments
 * (bio_split_rw_at() -> bvec_split_segs()); contiguous bvecs joining only lowers the count. A
 * bvec of L bytes is at most ceil(L / max) = (L - 1) / max + 1 segments, so the bio at most
 * vcnt + (bytes - vcnt) / max. Loop devices have a 64 KiB maximum: 1 MiB of contiguous memory
 * is one bvec and 16 segments, and counting it as one could claim a merge the segment limit
 * stops. A cut where a segment would cross seg_boundary_mask (4 GiB by default) is not counted.
 * Runs for every new request: the usual bio (bytes within one maximum segment) skips the division.
 */
static __always_inline __u32 mw_whole_bio_segments(__u32 vcnt, __u32 bytes, __u32 max_segment_size)
{
	if (max_segment_size == 0 || bytes <= vcnt || bytes - vcnt < max_segment_size)
		return vcnt;
	return vcnt + (bytes - vcnt) / max_segment_size;
}

/*
 * blk_chunk_sectors_left(): sectors from `offset` to the end of its chunk. The kernel
 * takes the power-of-two fast path or divides; a division by a non-constant is fine in
 * C++ and BPF alike (BPF has 64-bit unsigned division).
 */
static __always_inline __u32 mw_chunk_sectors_left(__u64 offset, __u32 chunk_sectors)
{
	if ((chunk_sectors & (chunk_sectors - 1)) == 0)
		return chunk_sectors - (__u32)(offset & (chunk_sectors - 1));
	return chunk_sectors - (__u32)(offset % chunk_sectors);
}

/*
 * MW_MERGE_OK if the kernel would back-merge `bio` into `rq` (the request, or the run of
 * bios a request would have become), else the rule that refuses it.
 */
static __always_inline int mw_back_merge_verdict(const struct mw_merge_side *rq, const struct mw_merge_side *bio,
						 const struct mw_merge_limits *lim)
{
	__u32 max_sectors, max_segments;

	if (rq->sector + rq->sectors != bio->sector)
		return MW_MERGE_NOT_CONTIGUOUS;
	/* rq_mergeable() and the op list: passthrough, flush, write zeroes, zone append. */
	if (!mw_op_mergeable(rq->op) || !mw_op_mergeable(bio->op))
		return MW_MERGE_OP_NOT_MERGEABLE;
	if ((rq->flags | bio->flags) & MW_F_NOMERGE_FLAGS)
		return MW_MERGE_NOMERGE_FLAGS;
	if (rq->op != bio->op)
		return MW_MERGE_OP_DIFFERS;
	/*
	 * blk_cgroup_mergeable() (v5.18, commit 6b2b04590b51 "blk-cgroup: don't merge across
	 * cgroup boundaries"): same blkg, and the same bio_issue_as_root_blkg() (META|SWAP).
	 */
	if (rq->blkg != bio->blkg ||
	    ((rq->flags & (MW_F_META | MW_F_SWAP)) != 0) != ((bio->flags & (MW_F_META | MW_F_SWAP)) != 0))
		return MW_MERGE_CGROUP;
	/*
	 * blk_integrity_merge_bio(): both or neither carry integrity metadata. When both do,
	 * the kernel also compares bip_flags and integrity segment counts, which a tracepoint
	 * does not see: refused here (never a claimed miss that may not be one).
	 */
	if ((rq->flags | bio->flags) & MW_F_INTEGRITY)
		return MW_MERGE_INTEGRITY;
	/*
	 * bio_crypt_rq_ctx_compatible(): neither or both with the same key, then the DUNs
	 * must be contiguous (bio_crypt_ctx_back_mergeable()); the DUN is not read, so any
	 * crypt context refuses.
	 */
	if ((rq->flags | bio->flags) & MW_F_CRYPT)
		return MW_MERGE_CRYPT;
	/* v6.9, commit 449813515d3e ("block, fs: Restore the per-bio/request data lifetime fields"). */
	if (rq->write_hint != bio->write_hint)
		return MW_MERGE_WRITE_HINT;
	if (rq->ioprio != bio->ioprio)
		return MW_MERGE_IOPRIO;
	/*
	 * v6.11, commit 9da3d1e912f3 ("block: Add core atomic write support"): atomic and
	 * plain writes never merge; two atomic writes are bounded by atomic-write limits not
	 * read here, so refused too.
	 */
	if ((rq->flags | bio->flags) & MW_F_ATOMIC)
		return MW_MERGE_ATOMIC;

	/* ll_back_merge_fn(): blk_rq_get_max_sectors(rq, blk_rq_pos(rq)). */
	max_sectors = mw_max_sectors_for_op(lim, rq->op);
	if ((__u64)rq->sectors + bio->sectors > max_sectors)
		return MW_MERGE_MAX_SECTORS;
	if (lim->chunk_sectors && rq->op != MW_OP_DISCARD && rq->op != MW_OP_SECURE_ERASE &&
	    (__u64)rq->sectors + bio->sectors > mw_chunk_sectors_left(rq->sector, lim->chunk_sectors))
		return MW_MERGE_CHUNK;
	/*
	 * req_gap_back_merge() -> bio_will_gap(): with a virt boundary (NVMe: the controller
	 * page), the request's first bvec must start aligned, and the seam must fall on the
	 * boundary (the previous data ends aligned, the next starts aligned). The kernel also
	 * lets physically contiguous bvecs through; that is not visible here, so refused.
	 */
	if (lim->virt_boundary_mask && rq->op != MW_OP_DISCARD && rq->op != MW_OP_SECURE_ERASE &&
	    (((rq->flags | bio->flags) & MW_F_OFFSETS_UNKNOWN) || (rq->first_offset & lim->virt_boundary_mask) || (rq->last_end & lim->virt_boundary_mask) ||
	     (bio->first_offset & lim->virt_boundary_mask)))
		return MW_MERGE_VIRT_GAP;
	/* ll_new_hw_segment(): blk_rq_get_max_segments() is max_discard_segments for discards. */
	max_segments = rq->op == MW_OP_DISCARD ? lim->max_discard_segments : lim->max_segments;
	if ((__u64)rq->segments + bio->segments > max_segments)
		return MW_MERGE_SEGMENTS;
	return MW_MERGE_OK;
}

/*
 * Which requests of a plug are still in it: a generation count per plug, read from the
 * kernel's own plug->rq_count, never from a version number.
 *
 * blk_attempt_plug_merge() (block/blk-merge.c) tries a bio against one request of the
 * submitting task's plug: the newest request of the bio's own queue. On 6.1-6.12 it walks
 * the plug list (newest first, LIFO) while plug->multiple_queues is set and stops at the
 * first request of the bio's queue; without multiple queues it looks at the newest request
 * only, which is then the newest of that queue too. On 5.4-5.15 it walks every request of
 * the queue (list_for_each_entry_reverse): the newest of the queue is one of them, so a
 * miss claimed against it is one the kernel would have found. blk_add_rq_to_plug() (and on
 * 5.10 blk_mq_submit_bio()) counts requests of *every* queue in plug->rq_count, so a plug
 * that alternates disks (md RAID0/10, striped LVs: A0 B0 A1) grows by more than one between
 * two requests of one disk, and "exactly one more" lost every such candidate.
 *
 * The rule here holds for every version: every request that joins a plug is preceded by its
 * own block_getrq in the same task (trace_block_getrq() follows both the cached and the
 * new-request path of blk_mq_submit_bio()), and the plug only empties (rq_count = 0 in
 * blk_mq_flush_plug_list()) or grows by one. So at each block_getrq, with the count the
 * previous one saw and whether its request was to join (a PREFLUSH/FUA request goes to
 * blk_insert_flush() instead):
 *   - count == previous count + joined: nothing was flushed, every request still there;
 *   - count == 1 after a joining request: the plug was flushed as that request was added
 *     (the full plug: BLK_MAX_REQUEST_COUNT 16 before 5.16, 32 from ba0ffdd8ce48, twice that
 *     with multiple queues in blk_plug_max_rq_count(); or a last request of BLK_PLUG_FLUSH_SIZE),
 *     so it alone is left: no limit needs to be known;
 *   - anything else (0 after a flush from schedule(), a request that did not join as
 *     predicted): none is left.
 * Each request gets a sequence number; a plug keeps the oldest number still in it, and a
 * queue's newest request is a candidate exactly while its number is not older than that.
 * Numbers are 64-bit and a plug's first number is above every number given out before on
 * the same CPU (the BPF side keeps that high-water mark per CPU; the plug states and the
 * slots whose numbers they judge are per CPU too), so a plug state that was evicted and
 * re-created never accepts a request recorded before.
 */
struct mw_plug_gen {
	__u64 plug;       /* struct blk_plug pointer; 0 = unused */
	__u64 next_seq;   /* the number the plug's next request gets */
	__u64 oldest_seq; /* the oldest number the plug still holds */
	__u32 last_count; /* plug->rq_count at the previous block_getrq */
	__u32 last_joins; /* 1 if that request was to join the plug */
};

/* A plug seen for the first time (or whose state was taken by another plug). */
static __always_inline void mw_plug_gen_start(struct mw_plug_gen *g, __u64 plug, __u64 first_seq)
{
	g->plug = plug;
	g->next_seq = first_seq;
	g->oldest_seq = first_seq;
	g->last_count = 0;
	g->last_joins = 0;
}

/* block_getrq saw plug->rq_count == count_now: drop what the plug no longer holds. */
static __always_inline void mw_plug_gen_observe(struct mw_plug_gen *g, __u32 count_now)
{
	if (count_now != 0 && count_now == g->last_count + g->last_joins)
		return;
	if (count_now == 1 && g->last_joins)
		g->oldest_seq = g->next_seq - 1;
	else
		g->oldest_seq = g->next_seq;
}

/* Is the request numbered `seq` still in the plug (after mw_plug_gen_observe())? */
static __always_inline int mw_plug_gen_holds(const struct mw_plug_gen *g, __u64 seq)
{
	return seq >= g->oldest_seq && seq < g->next_seq;
}

/* The new request takes the next number; `joins`: it will be added to the plug. */
static __always_inline __u64 mw_plug_gen_add(struct mw_plug_gen *g, __u32 count_now, __u32 joins)
{
	g->last_count = count_now;
	g->last_joins = joins;
	return g->next_seq++;
}

/* `rq` after `bio` was appended: what the merged request would have been. */
static __always_inline void mw_merge_side_append(struct mw_merge_side *rq, const struct mw_merge_side *bio)
{
	rq->sectors += bio->sectors;
	rq->segments += bio->segments;
	rq->last_end = bio->last_end;
}

#ifdef __cplusplus
static_assert(sizeof(struct mw_merge_side) == 48, "mw_merge_side layout");
static_assert(sizeof(struct mw_plug_gen) == 32, "mw_plug_gen layout");
#else
_Static_assert(sizeof(struct mw_merge_side) == 48, "mw_merge_side layout");
_Static_assert(sizeof(struct mw_plug_gen) == 32, "mw_plug_gen layout");
#endif

#endif /* MERGEWATCH_MERGE_RULES_H */
