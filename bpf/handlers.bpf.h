/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The handlers, compiled once per program flavor (mergewatch.bpf.c includes this file
 * twice): MW_FN(name) gives each flavor its own names, MW_READ(src, a, b...) reads
 * src->a->b. tp_btf arguments are typed kernel pointers, so plain loads work (the
 * verifier makes them fault-safe) and cost a few ns; raw_tp arguments are plain numbers
 * and need bpf_probe_read_kernel (BPF_CORE_READ), several times slower per field.
 * No include guard: that is the point.
 */
#include "core_fixes.bpf.h"

static __always_inline struct mw_dev_stats *MW_FN(stats_for)(struct gendisk *disk, __u32 op)
{
	struct mw_dev_key key = {};
	struct mw_dev_stats *stats;

	if (!disk) {
		count_event(MW_CNT_NO_DISK);
		return NULL;
	}
	key.major = MW_READ(disk, major);
	key.minor = MW_READ(disk, first_minor);
	key.op = op & MW_REQ_OP_MASK;
	key.diskseq = MW_FN(mw_disk_seq)(disk);
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

/*
 * Called for each new request (block_getrq): true if the bio continues the pending
 * request of its queue, same operation, and the run would still fit the queue's limits.
 */
static __always_inline bool MW_FN(missed_merge)(struct bio *bio, struct request_queue *q, __u32 op)
{
	struct pending_request *pending;
	__u32 queue_id = (__u32)MW_READ(q, id) + 1, index = queue_id & (MW_PENDING_SLOTS - 1);
	__u32 sectors, segments;
	__u64 sector;

	sector = MW_READ(bio, bi_iter.bi_sector);
	sectors = MW_READ(bio, bi_iter.bi_size) >> 9;
	segments = MW_READ(bio, bi_vcnt);
	pending = bpf_map_lookup_elem(&pending_requests, &index);
	if (!pending)
		return false;
	if (pending->queue_id == queue_id && !pending->issued && pending->op == op && pending->end_sector == sector &&
	    pending->run_sectors + sectors <= MW_READ(q, limits.max_sectors) &&
	    pending->run_segments + segments <= MW_READ(q, limits.max_segments)) {
		pending->start_sector = sector;
		pending->end_sector = sector + sectors;
		pending->run_sectors += sectors;
		pending->run_segments += segments;
		return true;
	}
	/* This bio starts a new run (or the slot changes queue). */
	pending->queue_id = queue_id;
	pending->start_sector = sector;
	pending->end_sector = sector + sectors;
	pending->op = op;
	pending->issued = 0;
	pending->run_sectors = sectors;
	pending->run_segments = segments;
	return false;
}

/* The pending request of its queue went to the driver: nothing can merge into it now. */
static __always_inline void MW_FN(mark_dispatched)(struct request *rq)
{
	struct pending_request *pending;
	__u32 queue_id = (__u32)MW_READ(rq, q, id) + 1, index = queue_id & (MW_PENDING_SLOTS - 1);

	pending = bpf_map_lookup_elem(&pending_requests, &index);
	if (pending && pending->queue_id == queue_id && pending->start_sector == MW_READ(rq, __sector))
		pending->issued = 1;
}

static __always_inline int MW_FN(handle_rq_insert)(struct request *rq)
{
	__u64 now = bpf_ktime_get_ns();
	struct mw_inflight *slot = inflight_slot(rq, now, true);

	if (!slot) {
		count_event(MW_CNT_INFLIGHT_FULL);
		return 0;
	}
	slot->insert_ns = now;
	slot->issue_ns = 0;
	return 0;
}

static __always_inline int MW_FN(handle_rq_issue)(struct request *rq)
{
	struct mw_dev_stats *stats;
	struct mw_inflight *slot;
	__u32 op, bytes;
	__u64 now;

	op = MW_READ(rq, cmd_flags) & MW_REQ_OP_MASK;
	bytes = MW_READ(rq, __data_len);
	stats = MW_FN(stats_for)(MW_FN(mw_rq_disk)(rq), op);
	if (!stats)
		return 0;
	hist_add(stats->size_slots, &stats->size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS);
	MW_FN(mark_dispatched)(rq);

	now = bpf_ktime_get_ns();
	slot = inflight_slot(rq, now, true);
	if (!slot) {
		count_event(MW_CNT_INFLIGHT_FULL);
		return 0;
	}
	if (slot->insert_ns && now >= slot->insert_ns)
		hist_add(stats->queue_latency_slots, &stats->queue_latency_sum_ns, now - slot->insert_ns,
			 MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
	slot->insert_ns = 0;
	slot->issue_ns = now;
	return 0;
}

static __always_inline int MW_FN(handle_rq_complete)(struct request *rq, __u32 nr_bytes)
{
	struct mw_dev_stats *stats;
	struct mw_inflight *slot;
	__u64 now, issue_ns;
	__u32 op;

	slot = inflight_slot(rq, 0, false);
	if (!slot) {
		count_event(MW_CNT_COMPLETE_UNMATCHED);
		return 0;
	}
	/* Partial completions fire too (nr_bytes < remaining bytes): wait for the last one. */
	if (nr_bytes < MW_READ(rq, __data_len))
		return 0;
	issue_ns = slot->issue_ns;
	slot->rq = 0;
	if (!issue_ns)
		return 0;
	now = bpf_ktime_get_ns();
	if (now < issue_ns)
		return 0;
	op = MW_READ(rq, cmd_flags) & MW_REQ_OP_MASK;
	stats = MW_FN(stats_for)(MW_FN(mw_rq_disk)(rq), op);
	if (stats)
		hist_add(stats->latency_slots, &stats->latency_sum_ns, now - issue_ns,
			 MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
	return 0;
}

static __always_inline int MW_FN(handle_bio_merge)(struct bio *bio, bool back)
{
	struct mw_dev_stats *stats;

	stats = MW_FN(stats_for)(MW_FN(mw_bio_disk)(bio), MW_READ(bio, bi_opf));
	if (!stats)
		return 0;
	if (back)
		stats->back_merges++;
	else
		stats->front_merges++;
	return 0;
}

/* Only bio-based devices (dm, md: no blk-mq ops): request-based ones are counted per request. */
static __always_inline int MW_FN(handle_bio_queue)(struct bio *bio)
{
	struct gendisk *disk = MW_FN(mw_bio_disk)(bio);
	struct mw_dev_stats *stats;
	__u32 bytes;

	if (!disk || MW_READ(disk, queue, mq_ops))
		return 0;
	stats = MW_FN(stats_for)(disk, MW_READ(bio, bi_opf));
	if (!stats)
		return 0;
	bytes = MW_READ(bio, bi_iter.bi_size);
	hist_add(stats->bio_size_slots, &stats->bio_size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT,
		 MW_SIZE_SLOTS);
	return 0;
}

/*
 * A stacking driver (dm, md, NVMe multipath) sent the bio on from `from_devt`. Partition
 * remaps (the bio keeps its bdev: from == to) start no chain of their own, but pass an
 * existing one on, since a dm target may sit on a partition.
 */
static __always_inline int MW_FN(handle_bio_remap)(struct bio *bio, __u32 from_devt, __u64 from_sector)
{
	struct remap_key from = { .devt = from_devt, .sector = from_sector }, to = {};
	__u32 *chained, origin;

	to.devt = MW_FN(mw_bio_devt)(bio);
	to.sector = MW_READ(bio, bi_iter.bi_sector);
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
static __always_inline void MW_FN(count_origin)(struct bio *bio, struct gendisk *disk, __u32 op, bool missed)
{
	struct remap_key at = {};
	struct mw_origin_key key = {};
	struct mw_origin_stats *stats;
	static const struct mw_origin_stats zero;
	__u32 *origin;

	at.devt = MW_FN(mw_bio_devt)(bio);
	at.sector = MW_READ(bio, bi_iter.bi_sector);
	origin = bpf_map_lookup_elem(&remap_origin, &at);
	if (!origin)
		return;
	key.origin_major = *origin >> MW_MINORBITS;
	key.origin_minor = *origin & ((1u << MW_MINORBITS) - 1);
	bpf_map_delete_elem(&remap_origin, &at);
	key.major = MW_READ(disk, major);
	key.minor = MW_READ(disk, first_minor);
	key.op = op;
	key.diskseq = MW_FN(mw_disk_seq)(disk);
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

static __always_inline int MW_FN(handle_getrq)(struct bio *bio)
{
	struct gendisk *disk = MW_FN(mw_bio_disk)(bio);
	struct mw_dev_stats *stats;
	bool missed;
	__u32 op;

	if (!disk)
		return 0;
	op = MW_READ(bio, bi_opf) & MW_REQ_OP_MASK;
	missed = MW_FN(missed_merge)(bio, MW_READ(disk, queue), op);
	if (remaps_seen)
		MW_FN(count_origin)(bio, disk, op, missed);
	if (!missed)
		return 0;
	stats = MW_FN(stats_for)(disk, op);
	if (stats)
		stats->missed_merges++;
	return 0;
}
