// SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
/*
 * The least any per-device request-size and latency histogram costs on the block tracepoints: what
 * the target "BPF <= 300 ns per I/O with every feature on" is measured against (BENCHMARKS.md, "The
 * lower bound"). Not mergewatch: no merge rules (block_getrq is attached but empty), no scheduler
 * queue time, no requeue, no stacking, no nesting guard (a nested program may take another's slot:
 * wrong here, harmless for a cost measurement). Loaded by the floor loader; measured with
 * bench/bpf_ab.py against the floor and mergewatchd.
 *
 * GETRQ_EVIDENCE=1: block_getrq does the least any missed-merge check can do (the plug rule of
 * blk_attempt_plug_merge() cut to its core: one per-CPU record of the last new request's plug, disk,
 * op and end sector; a bio that continues it counts a missed merge for its disk). What mergewatch's
 * block_getrq does on top: the plug's generation count, 16 plug slots per CPU, the scheduler's
 * candidates, the flags, size, segment and virt-boundary rules. The floor of the detector's evidence,
 * measured in `make bench` beside the bound that leaves block_getrq empty.
 *
 * COUNT_AT_COMPLETION=1: the completion-centric design proposed for it. Dispatch keeps the clock
 * and the size in the request's in-flight slot; the final completion does the one device lookup
 * and both histograms. COUNT_AT_COMPLETION=0: what mergewatchd does, the size counted at dispatch
 * (a skipped nested completion then costs a latency sample, not a request), so one device lookup
 * at dispatch and one at completion.
 *
 * HASHLESS=1: no table at all (what Rezolus moved to in 2026, iopsystems/rezolus PR #1148): the size counted at
 * dispatch, the latency at completion from the kernel's own dispatch stamp (rq->io_start_time_ns, 0 where the
 * queue keeps no stats: not timed). Since v6.9 that stamp may be a plug's cached clock, too early
 * (docs/design/request-clock.md): the cost of histograms that are not exact everywhere.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "mergewatch/abi.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#ifndef COUNT_AT_COMPLETION
#define COUNT_AT_COMPLETION 1
#endif
#ifndef GETRQ_EVIDENCE
#define GETRQ_EVIDENCE 0
#endif
#ifndef HASHLESS
#define HASHLESS 0
#endif

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MW_MAX_DEV_OP_KEYS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mw_dev_key);
	__type(value, struct mw_dev_stats);
} dev_stats SEC(".maps");

/* One way of mergewatch's in-flight table: the cheapest request -> slot mapping there is. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MW_DEFAULT_INFLIGHT_ENTRIES);
	__type(key, __u32);
	__type(value, struct mw_inflight);
} inflight SEC(".maps");

/* A typed pointer becomes a number by a store and a load (mergewatch.bpf.c explains why). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} pointer_cell SEC(".maps");

static const struct mw_dev_stats zero_stats;

static __always_inline struct mw_inflight *slot_of(struct request *rq)
{
	__u32 zero = 0, index;
	volatile __u64 *cell = bpf_map_lookup_elem(&pointer_cell, &zero);

	if (!cell)
		return NULL;
	*cell = (__u64)rq;
	index = (__u32)(((*cell >> 6) * 0x9E3779B97F4A7C15ull) >> (64 - 16));
	return bpf_map_lookup_elem(&inflight, &index);
}

static __always_inline struct mw_dev_stats *stats_of(struct request *rq)
{
	struct gendisk *disk = rq->q->disk;
	struct mw_dev_key key = {};
	struct mw_dev_stats *stats;

	if (!disk)
		return NULL;
	key.major = disk->major;
	key.minor = disk->first_minor;
	key.op = rq->cmd_flags & MW_REQ_OP_MASK;
	key.diskseq = disk->diskseq;
	stats = bpf_map_lookup_elem(&dev_stats, &key);
	if (stats)
		return stats;
	bpf_map_update_elem(&dev_stats, &key, &zero_stats, BPF_NOEXIST);
	return bpf_map_lookup_elem(&dev_stats, &key);
}

static __always_inline void hist_add(__u64 *slots, __u64 *sum, __u64 value, __u32 min_shift, __u32 nslots)
{
	__u32 slot = mw_hist_slot(value, min_shift, nslots);

	barrier_var(slot);
	if (slot < nslots)
		slots[slot]++;
	*sum += value;
}

/* The last new request on this CPU, for GETRQ_EVIDENCE; `cell` turns a typed pointer into a number. */
struct last_request {
	__u64 cell;
	__u64 plug;
	__u64 disk;
	__u64 end_sector;
	__u32 op;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct last_request);
} last_request SEC(".maps");

SEC("tp_btf/block_getrq")
int BPF_PROG(lower_bound_getrq, struct bio *bio)
{
	if (GETRQ_EVIDENCE) {
		__u32 zero = 0;
		struct last_request *last = bpf_map_lookup_elem(&last_request, &zero);
		struct task_struct *task = bpf_get_current_task_btf();
		struct gendisk *disk = bio->bi_bdev->bd_disk;
		__u64 sector = bio->bi_iter.bi_sector, plug, disk_id;
		__u32 op = bio->bi_opf & MW_REQ_OP_MASK;

		if (!last || !disk)
			return 0;
		last->cell = (__u64)task->plug;
		plug = last->cell;
		last->cell = (__u64)disk;
		disk_id = last->cell;
		if (plug && plug == last->plug && disk_id == last->disk && op == last->op && sector == last->end_sector) {
			struct mw_dev_key key = { .major = disk->major, .minor = disk->first_minor, .op = op,
						  .diskseq = disk->diskseq };
			struct mw_dev_stats *stats = bpf_map_lookup_elem(&dev_stats, &key);

			if (stats)
				stats->missed_merges++;
		}
		last->plug = plug;
		last->disk = disk_id;
		last->op = op;
		last->end_sector = sector + (bio->bi_iter.bi_size >> 9);
	}
	return 0;
}

SEC("tp_btf/block_rq_issue")
int BPF_PROG(lower_bound_rq_issue, struct request *rq)
{
	struct mw_inflight *slot;
	__u32 bytes = rq->__data_len;

	if (HASHLESS) {
		struct mw_dev_stats *stats = stats_of(rq);

		if (stats)
			hist_add(stats->size_slots, &stats->size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS);
		return 0;
	}
	slot = slot_of(rq);
	if (!COUNT_AT_COMPLETION) {
		struct mw_dev_stats *stats = stats_of(rq);

		if (stats)
			hist_add(stats->size_slots, &stats->size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS);
	}
	if (slot) {
		slot->issue_ns = bpf_ktime_get_ns();
		slot->insert_ns = bytes; /* the size, for the completion to count */
	}
	return 0;
}

SEC("tp_btf/block_rq_complete")
int BPF_PROG(lower_bound_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	struct mw_inflight *slot;
	struct mw_dev_stats *stats;
	__u64 issue_ns, now;

	if (HASHLESS) {
		issue_ns = rq->io_start_time_ns;
		if (!issue_ns || nr_bytes < rq->__data_len)
			return 0;
		now = bpf_ktime_get_ns();
		stats = stats_of(rq);
		if (stats)
			hist_add(stats->latency_slots, &stats->latency_sum_ns, now > issue_ns ? now - issue_ns : 0,
				 MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
		return 0;
	}
	slot = slot_of(rq);
	if (!slot || !slot->issue_ns)
		return 0;
	issue_ns = slot->issue_ns;
	slot->issue_ns = 0;
	now = bpf_ktime_get_ns();
	stats = stats_of(rq);
	if (!stats)
		return 0;
	if (COUNT_AT_COMPLETION)
		hist_add(stats->size_slots, &stats->size_sum_bytes, slot->insert_ns, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS);
	hist_add(stats->latency_slots, &stats->latency_sum_ns, now - issue_ns, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
	return 0;
}
