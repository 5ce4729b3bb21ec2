// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * mergewatch: per-device request size, latency and merge accounting on the block
 * tracepoints. Everything is aggregated in the kernel into per-CPU histograms; the
 * daemon reads the maps at scrape time. No per-event traffic to user space.
 *
 * Two program sets share one handler each: tp_btf (typed, cheapest) and a raw_tp
 * fallback for kernels whose BTF cannot back tp_btf. The daemon enables one set with
 * bpf_program__set_autoload() and sets the argument positions below from BTF.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "mergewatch/abi.h"
#include "core_fixes.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/*
 * Argument positions, set by the daemon from the btf_trace_<tp> prototypes.
 * v5.11 dropped the request_queue argument of the request and bio-merge tracepoints:
 * commit a54895fa057c ("block: remove the request_queue to argument request based tracepoints")
 * commit e8a676d61c07 ("block: simplify and extend the block_bio_merge tracepoint class")
 * (also backported to 5.10.y, which is why the position comes from BTF, not from a version).
 */
const volatile __u32 targ_rq_arg = 0;        /* block_rq_insert/issue: (rq) or (q, rq) */
const volatile __u32 targ_bio_merge_arg = 0; /* block_bio_*merge: (bio) or (q, rq, bio) */
const volatile __u32 targ_bio_queue_arg = 0; /* block_bio_queue: (bio) or (q, bio) */
const volatile __u32 targ_getrq_arg = 0;     /* block_getrq: (bio) or (q, bio, rw) */
/* block_bio_remap: (bio, dev, from) or (q, bio, dev, from); commit 1c02fca620f7 (v5.11) */
const volatile __u32 targ_bio_remap_arg = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MW_MAX_DEV_OP_KEYS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mw_dev_key);
	__type(value, struct mw_dev_stats);
} dev_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MW_DEFAULT_INFLIGHT_ENTRIES);
	__type(key, __u64);
	__type(value, struct mw_inflight);
} inflight SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MW_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} event_counts SEC(".maps");

/*
 * The newest request created on each queue that has not been dispatched yet. A bio that
 * needs a new request (block_getrq) although it continues this one is a merge that was
 * possible and did not happen: the two met while still mergeable, in a plug or in the
 * scheduler's queue. Keyed by queue; LRU because queues come and go.
 */
struct pending_request {
	__u64 start_sector;
	__u64 end_sector;
	__u32 op;
	__u32 issued;
	__u32 run_sectors; /* the contiguous run merging could have built, so far */
	__u32 run_segments;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, struct pending_request);
} pending_requests SEC(".maps");

/*
 * The remap chain, one hop at a time: each block_bio_remap leaves (the device and sector
 * the bio now addresses) -> (the device the chain started at). The next hop, or the
 * request the bio finally becomes (block_getrq), looks its own (device, sector) up and
 * takes the entry. Bios that merge into an existing request never ask: LRU drops them.
 */
struct remap_key {
	__u32 devt;
	__u32 pad;
	__u64 sector;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MW_REMAP_ENTRIES);
	__type(key, struct remap_key);
	__type(value, __u32); /* origin dev_t */
} remap_origin SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MW_MAX_ORIGIN_KEYS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mw_origin_key);
	__type(value, struct mw_origin_stats);
} origin_stats SEC(".maps");

/* Set once a stacking driver remapped a bio: until then no request pays for the lookup. */
__u32 remaps_seen = 0;

/* Zero value for lookup-or-init: too large for the 512-byte BPF stack. */
static const struct mw_dev_stats zero_stats;

static __always_inline void count_event(__u32 idx)
{
	__u64 *cnt = bpf_map_lookup_elem(&event_counts, &idx);

	if (cnt)
		(*cnt)++;
}

static __always_inline struct mw_dev_stats *stats_for(struct gendisk *disk, __u32 op)
{
	struct mw_dev_key key = {};
	struct mw_dev_stats *stats;

	if (!disk) {
		count_event(MW_CNT_NO_DISK);
		return NULL;
	}
	key.major = BPF_CORE_READ(disk, major);
	key.minor = BPF_CORE_READ(disk, first_minor);
	key.op = op & MW_REQ_OP_MASK;
	key.diskseq = mw_disk_seq(disk);
	stats = bpf_map_lookup_elem(&dev_stats, &key);
	if (stats)
		return stats;
	/* EEXIST from a racing CPU is fine: the lookup below finds its entry. */
	bpf_map_update_elem(&dev_stats, &key, &zero_stats, BPF_NOEXIST);
	stats = bpf_map_lookup_elem(&dev_stats, &key);
	if (!stats)
		count_event(MW_CNT_STATS_FULL);
	return stats;
}

static __always_inline void hist_add(__u64 *slots, __u64 *sum, __u64 value, __u32 min_shift,
				     __u32 nslots)
{
	__u32 slot = mw_hist_slot(value, min_shift, nslots);

	/*
	 * mw_hist_slot() already clamps, so clang drops a plain re-check; older verifiers
	 * (6.1) cannot see through the clamp and reject the access as unbounded. The
	 * barrier keeps the check in the program.
	 */
	barrier_var(slot);
	if (slot < nslots)
		slots[slot]++;
	*sum += value;
}

/*
 * Called for each new request (block_getrq): true if the bio continues the pending
 * request of its queue, same operation, and the run would still fit the queue's limits.
 */
static __always_inline bool missed_merge(struct bio *bio, struct request_queue *q, __u32 op)
{
	struct pending_request *pending, fresh = {};
	__u64 key = (__u64)q, sector;
	__u32 sectors, segments;

	sector = BPF_CORE_READ(bio, bi_iter.bi_sector);
	sectors = BPF_CORE_READ(bio, bi_iter.bi_size) >> 9;
	segments = BPF_CORE_READ(bio, bi_vcnt);
	pending = bpf_map_lookup_elem(&pending_requests, &key);
	if (pending && !pending->issued && pending->op == op && pending->end_sector == sector &&
	    pending->run_sectors + sectors <= BPF_CORE_READ(q, limits.max_sectors) &&
	    pending->run_segments + segments <= BPF_CORE_READ(q, limits.max_segments)) {
		pending->start_sector = sector;
		pending->end_sector = sector + sectors;
		pending->run_sectors += sectors;
		pending->run_segments += segments;
		return true;
	}
	fresh.start_sector = sector;
	fresh.end_sector = sector + sectors;
	fresh.op = op;
	fresh.run_sectors = sectors;
	fresh.run_segments = segments;
	bpf_map_update_elem(&pending_requests, &key, &fresh, BPF_ANY);
	return false;
}

/* The pending request of its queue went to the driver: nothing can merge into it now. */
static __always_inline void mark_dispatched(struct request *rq)
{
	struct pending_request *pending;
	__u64 key = (__u64)BPF_CORE_READ(rq, q);

	pending = bpf_map_lookup_elem(&pending_requests, &key);
	if (pending && pending->start_sector == BPF_CORE_READ(rq, __sector))
		pending->issued = 1;
}

static __always_inline int handle_rq_insert(struct request *rq)
{
	struct mw_inflight *inf, fresh = {};
	__u64 key = (__u64)rq;

	inf = bpf_map_lookup_elem(&inflight, &key);
	if (inf) {
		inf->insert_ns = bpf_ktime_get_ns();
		inf->issue_ns = 0;
		return 0;
	}
	fresh.insert_ns = bpf_ktime_get_ns();
	if (bpf_map_update_elem(&inflight, &key, &fresh, BPF_ANY))
		count_event(MW_CNT_INFLIGHT_FULL);
	return 0;
}

static __always_inline int handle_rq_issue(struct request *rq)
{
	struct mw_dev_stats *stats;
	struct mw_inflight *inf, fresh = {};
	__u64 key = (__u64)rq, now;
	__u32 op, bytes;

	op = BPF_CORE_READ(rq, cmd_flags) & MW_REQ_OP_MASK;
	bytes = BPF_CORE_READ(rq, __data_len);
	stats = stats_for(mw_rq_disk(rq), op);
	if (!stats)
		return 0;
	hist_add(stats->size_slots, &stats->size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS);
	mark_dispatched(rq);

	now = bpf_ktime_get_ns();
	inf = bpf_map_lookup_elem(&inflight, &key);
	if (inf) {
		if (inf->insert_ns && now >= inf->insert_ns)
			hist_add(stats->queue_latency_slots, &stats->queue_latency_sum_ns,
				 now - inf->insert_ns, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
		inf->insert_ns = 0;
		inf->issue_ns = now;
		return 0;
	}
	fresh.issue_ns = now;
	if (bpf_map_update_elem(&inflight, &key, &fresh, BPF_ANY))
		count_event(MW_CNT_INFLIGHT_FULL);
	return 0;
}

static __always_inline int handle_rq_complete(struct request *rq, __u32 nr_bytes)
{
	struct mw_dev_stats *stats;
	struct mw_inflight *inf;
	__u64 key = (__u64)rq, now, issue_ns;
	__u32 op;

	inf = bpf_map_lookup_elem(&inflight, &key);
	if (!inf) {
		count_event(MW_CNT_COMPLETE_UNMATCHED);
		return 0;
	}
	/* Partial completions fire too (nr_bytes < remaining bytes): wait for the last one. */
	if (nr_bytes < BPF_CORE_READ(rq, __data_len))
		return 0;
	issue_ns = inf->issue_ns;
	bpf_map_delete_elem(&inflight, &key);
	if (!issue_ns)
		return 0;
	now = bpf_ktime_get_ns();
	if (now < issue_ns)
		return 0;
	op = BPF_CORE_READ(rq, cmd_flags) & MW_REQ_OP_MASK;
	stats = stats_for(mw_rq_disk(rq), op);
	if (stats)
		hist_add(stats->latency_slots, &stats->latency_sum_ns, now - issue_ns,
			 MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
	return 0;
}

static __always_inline int handle_bio_merge(struct bio *bio, bool back)
{
	struct mw_dev_stats *stats;

	stats = stats_for(mw_bio_disk(bio), BPF_CORE_READ(bio, bi_opf));
	if (!stats)
		return 0;
	if (back)
		stats->back_merges++;
	else
		stats->front_merges++;
	return 0;
}

/* Only bio-based devices (dm, md: no blk-mq ops): request-based ones are counted per request. */
static __always_inline int handle_bio_queue(struct bio *bio)
{
	struct gendisk *disk = mw_bio_disk(bio);
	struct mw_dev_stats *stats;
	__u32 bytes;

	if (!disk || BPF_CORE_READ(disk, queue, mq_ops))
		return 0;
	stats = stats_for(disk, BPF_CORE_READ(bio, bi_opf));
	if (!stats)
		return 0;
	bytes = BPF_CORE_READ(bio, bi_iter.bi_size);
	hist_add(stats->bio_size_slots, &stats->bio_size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT,
		 MW_SIZE_SLOTS);
	return 0;
}

/*
 * A stacking driver (dm, md, NVMe multipath) sent the bio on from `from_devt`. Partition
 * remaps (the bio keeps its bdev: from == to) start no chain of their own, but pass an
 * existing one on, since a dm target may sit on a partition.
 */
static __always_inline int handle_bio_remap(struct bio *bio, __u32 from_devt, __u64 from_sector)
{
	struct remap_key from = { .devt = from_devt, .sector = from_sector }, to = {};
	__u32 *chained, origin;

	to.devt = mw_bio_devt(bio);
	to.sector = BPF_CORE_READ(bio, bi_iter.bi_sector);
	chained = bpf_map_lookup_elem(&remap_origin, &from);
	if (chained) {
		origin = *chained;
		bpf_map_delete_elem(&remap_origin, &from);
	} else if (from_devt != to.devt) {
		origin = from_devt;
	} else {
		return 0;
	}
	bpf_map_update_elem(&remap_origin, &to, &origin, BPF_ANY);
	remaps_seen = 1;
	return 0;
}

/* The new request's first bio came down a remap chain: count it for the chain's origin. */
static __always_inline void count_origin(struct bio *bio, struct gendisk *disk, __u32 op, bool missed)
{
	struct remap_key at = {};
	struct mw_origin_key key = {};
	struct mw_origin_stats *stats;
	static const struct mw_origin_stats zero;
	__u32 *origin;

	at.devt = mw_bio_devt(bio);
	at.sector = BPF_CORE_READ(bio, bi_iter.bi_sector);
	origin = bpf_map_lookup_elem(&remap_origin, &at);
	if (!origin)
		return;
	key.origin_major = *origin >> MW_MINORBITS;
	key.origin_minor = *origin & ((1u << MW_MINORBITS) - 1);
	bpf_map_delete_elem(&remap_origin, &at);
	key.major = BPF_CORE_READ(disk, major);
	key.minor = BPF_CORE_READ(disk, first_minor);
	key.op = op;
	key.diskseq = mw_disk_seq(disk);
	stats = bpf_map_lookup_elem(&origin_stats, &key);
	if (!stats) {
		bpf_map_update_elem(&origin_stats, &key, &zero, BPF_NOEXIST);
		stats = bpf_map_lookup_elem(&origin_stats, &key);
		if (!stats) {
			count_event(MW_CNT_ORIGIN_FULL);
			return;
		}
	}
	stats->requests++;
	if (missed)
		stats->missed_merges++;
}

static __always_inline int handle_getrq(struct bio *bio)
{
	struct gendisk *disk = mw_bio_disk(bio);
	struct mw_dev_stats *stats;
	bool missed;
	__u32 op;

	if (!disk)
		return 0;
	op = BPF_CORE_READ(bio, bi_opf) & MW_REQ_OP_MASK;
	missed = missed_merge(bio, BPF_CORE_READ(disk, queue), op);
	if (remaps_seen)
		count_origin(bio, disk, op, missed);
	if (!missed)
		return 0;
	stats = stats_for(disk, op);
	if (stats)
		stats->missed_merges++;
	return 0;
}

/* Constant-offset context reads: the verifier rejects a variable index into ctx. */
#define RQ_ARG(ctx) ((struct request *)(targ_rq_arg ? (ctx)[1] : (ctx)[0]))
#define BIO_MERGE_ARG(ctx) ((struct bio *)(targ_bio_merge_arg ? (ctx)[2] : (ctx)[0]))
#define BIO_QUEUE_ARG(ctx) ((struct bio *)(targ_bio_queue_arg ? (ctx)[1] : (ctx)[0]))
#define GETRQ_ARG(ctx) ((struct bio *)(targ_getrq_arg ? (ctx)[1] : (ctx)[0]))

/* Three arguments from one of two positions: two separate constant-offset paths. */
static __always_inline int remap_from_ctx(__u64 *ctx)
{
	if (targ_bio_remap_arg)
		return handle_bio_remap((struct bio *)ctx[1], (__u32)ctx[2], ctx[3]);
	return handle_bio_remap((struct bio *)ctx[0], (__u32)ctx[1], ctx[2]);
}

/* tp_btf set */
SEC("tp_btf/block_rq_insert")
int BPF_PROG(btf_rq_insert) { return handle_rq_insert(RQ_ARG(ctx)); }

SEC("tp_btf/block_rq_issue")
int BPF_PROG(btf_rq_issue) { return handle_rq_issue(RQ_ARG(ctx)); }

/* (rq, error, nr_bytes) since v4.13; raw_tp/tp_btf need 4.17+ anyway. */
SEC("tp_btf/block_rq_complete")
int BPF_PROG(btf_rq_complete) { return handle_rq_complete((void *)ctx[0], (__u32)ctx[2]); }

SEC("tp_btf/block_bio_backmerge")
int BPF_PROG(btf_bio_backmerge) { return handle_bio_merge(BIO_MERGE_ARG(ctx), true); }

SEC("tp_btf/block_bio_frontmerge")
int BPF_PROG(btf_bio_frontmerge) { return handle_bio_merge(BIO_MERGE_ARG(ctx), false); }

SEC("tp_btf/block_bio_queue")
int BPF_PROG(btf_bio_queue) { return handle_bio_queue(BIO_QUEUE_ARG(ctx)); }

SEC("tp_btf/block_getrq")
int BPF_PROG(btf_getrq) { return handle_getrq(GETRQ_ARG(ctx)); }

SEC("tp_btf/block_bio_remap")
int BPF_PROG(btf_bio_remap) { return remap_from_ctx(ctx); }

/* raw_tp fallback set: same handlers, untyped arguments */
SEC("raw_tp/block_rq_insert")
int raw_rq_insert(__u64 *ctx) { return handle_rq_insert(RQ_ARG(ctx)); }

SEC("raw_tp/block_rq_issue")
int raw_rq_issue(__u64 *ctx) { return handle_rq_issue(RQ_ARG(ctx)); }

SEC("raw_tp/block_rq_complete")
int raw_rq_complete(__u64 *ctx) { return handle_rq_complete((void *)ctx[0], (__u32)ctx[2]); }

SEC("raw_tp/block_bio_backmerge")
int raw_bio_backmerge(__u64 *ctx) { return handle_bio_merge(BIO_MERGE_ARG(ctx), true); }

SEC("raw_tp/block_bio_frontmerge")
int raw_bio_frontmerge(__u64 *ctx) { return handle_bio_merge(BIO_MERGE_ARG(ctx), false); }

SEC("raw_tp/block_bio_queue")
int raw_bio_queue(__u64 *ctx) { return handle_bio_queue(BIO_QUEUE_ARG(ctx)); }

SEC("raw_tp/block_getrq")
int raw_getrq(__u64 *ctx) { return handle_getrq(GETRQ_ARG(ctx)); }

SEC("raw_tp/block_bio_remap")
int raw_bio_remap(__u64 *ctx) { return remap_from_ctx(ctx); }
