/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * The one ABI shared by the BPF programs (bpf/mergewatch.bpf.c) and the daemon.
 *
 * BPF includes this after vmlinux.h, C++ after <linux/types.h>. Only fixed-width
 * __u32/__u64 fields with explicit padding: no bool, enum-typed fields or bitfields,
 * so that both compilers agree on every offset (asserted below and in the unit tests
 * against the skeleton's map key/value sizes).
 *
 * All counters are cumulative u64 and are never reset by the daemon: Prometheus
 * counters must be monotonic.
 */
#ifndef MERGEWATCH_ABI_H
#define MERGEWATCH_ABI_H

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/*
 * Request and bio size histograms: bucket i counts sizes <= 2^(MW_SIZE_MIN_SHIFT + i)
 * bytes, i.e. Prometheus le="512" ... le="33554432" (32 MiB); the last slot counts
 * larger sizes (only le="+Inf" covers it). Ceil-log2 so a 4096-byte request lands in
 * le="4096" exactly (floor-log2 would put it with 4097..8191).
 */
#define MW_SIZE_MIN_SHIFT 9
#define MW_SIZE_MAX_SHIFT 25
#define MW_SIZE_SLOTS (MW_SIZE_MAX_SHIFT - MW_SIZE_MIN_SHIFT + 2)

/*
 * Latency histograms in nanoseconds: bucket i counts latencies <= 2^(MW_LAT_MIN_SHIFT + i) ns,
 * from 1.024 us up to 2^36 ns = 68.7 s; the last slot counts anything slower.
 */
#define MW_LAT_MIN_SHIFT 10
#define MW_LAT_MAX_SHIFT 36
#define MW_LAT_SLOTS (MW_LAT_MAX_SHIFT - MW_LAT_MIN_SHIFT + 2)

/* Bounds of the maps; the in-flight map size can be changed at load time. */
#define MW_MAX_DEV_OP_KEYS 8192
#define MW_MAX_ORIGIN_KEYS 4096
/* (pair, op, cgroup) request counters: an LRU map, an evicted key counts from 0 again. */
#define MW_MAX_SERVICE_KEYS 4096
/*
 * Keys a BPF program could not create in dev_stats or origin_stats (ENOMEM, E2BIG, EBUSY) are
 * counted in a preallocated map of this size each, summed with the main map by the daemon
 * (the *_spill maps in mergewatch.bpf.c say why).
 */
#define MW_SPILL_KEYS 32
/* Remapped bios waiting for their request: the chain's last hop per (device, sector). */
#define MW_REMAP_ENTRIES 16384
#define MW_DEFAULT_INFLIGHT_ENTRIES 65536

/*
 * Kernel identities, defined here once for the BPF programs and the daemon.
 *
 * The kernel-internal dev_t, as tracepoints' dev fields and the remap chain carry it
 * (include/linux/kdev_t.h): MKDEV(ma, mi) = ma << MINORBITS | mi, MINORBITS 20, 12 major bits.
 * Not the userspace st_rdev encoding.
 */
#define MW_MINORBITS 20
#define MW_MINORMASK ((1u << MW_MINORBITS) - 1)
#define MW_MAJORMASK ((1u << (32 - MW_MINORBITS)) - 1)
#define MW_MKDEV(ma, mi) (((__u32)(ma) << MW_MINORBITS) | (__u32)(mi))

/* REQ_OP_MASK: the low 8 bits of cmd_flags / bi_opf hold the operation since v4.10. */
#define MW_REQ_OP_MASK 0xffu
/*
 * The REQ_OP_* values this code reads (enum req_op, include/linux/blk_types.h): these have kept their
 * numbers on every kernel supported (5.4 to 6.18). Others have moved (REQ_OP_ZONE_APPEND was 13 and is 7
 * since enum req_op was renumbered): one of those would be read from the kernel's BTF with CO-RE
 * (bpf_core_enum_value), never written here. Everything not listed is the "other" op label.
 */
#define MW_OP_READ 0u
#define MW_OP_WRITE 1u
#define MW_OP_FLUSH 2u
#define MW_OP_DISCARD 3u
#define MW_OP_SECURE_ERASE 5u
#define MW_OP_WRITE_ZEROES 9u
#define MW_OP_DRV_IN 34u
#define MW_OP_DRV_OUT 35u

/*
 * Per device and operation. major/minor are kept apart to avoid the two dev_t encodings.
 * diskseq (v5.15+, 0 before) tells a re-created device apart from the one that had its
 * major:minor before: a reused loop minor starts from zero, and the daemon drops the
 * keys whose diskseq no longer matches sysfs.
 */
struct mw_dev_key {
	__u32 major;
	__u32 minor;
	__u32 op; /* raw REQ_OP_* value; the daemon maps it to a label */
	__u32 pad;
	__u64 diskseq;
};

/*
 * Requests created at a disk (block_getrq) for bios that a stacking driver remapped
 * there (block_bio_remap chain): which upper device the disk's requests come from.
 * origin is the top of the chain, the device the bio was first submitted to (dm-3 for a
 * read of an LVM snapshot, not the dm-1 -real layer it passed through).
 */
struct mw_origin_key {
	__u32 major; /* the disk the request was created at */
	__u32 minor;
	__u32 origin_major;
	__u32 origin_minor;
	__u32 op;
	__u32 pad;
	__u64 diskseq; /* of the disk, as in mw_dev_key */
};

/*
 * The evidence of one (disk, upper device) pair, so that the detector decides per device the
 * I/O was submitted to: a backup reading a snapshot pages beside any healthy I/O on its origin.
 */
struct mw_origin_stats {
	__u64 requests;
	__u64 missed_merges; /* of those requests, how many were a missed merge */
	__u64 request_bytes; /* bytes of the bio each request was made for (block_getrq) */
	__u64 missed_merge_runs;     /* as in mw_dev_stats, for the runs of this pair's requests */
	__u64 missed_merge_run_bytes;
	__u64 merges; /* bios from this origin merged into a request (block_bio_backmerge/frontmerge) */
	/*
	 * The volume's own view (the upper device the pair's requests came from): requests and bytes
	 * as dispatched (block_rq_issue, after every merge, as the disk's size_slots count them) and
	 * their device time to the final completion. Over a disk's pairs these sum to the disk's
	 * size count, size_sum_bytes and latency histogram, for the requests whose first bio came
	 * down a remap chain.
	 */
	__u64 dispatched;
	__u64 dispatched_bytes;
	__u64 latency_slots[MW_LAT_SLOTS];
	__u64 latency_sum_ns;
};

/*
 * How the BPF side came by a chain's cgroup id (daemon/attribution/cgroup_names.h, CgroupSource):
 * the submitting task, the bio's blkcg association, or a kernel thread writing back pages whose
 * owner the io controller did not record (id: the root cgroup's). A kernel thread's read has
 * id 0 (MW_CG_TASK): "kernel".
 */
#define MW_CG_TASK 0
#define MW_CG_BLKCG 1
#define MW_CG_WRITEBACK 2

/*
 * Requests created at a disk for bios remapped there from an upper device, per cgroup that
 * submitted the chain's top bio: the services behind a (disk, upper device) pair.
 */
struct mw_service_key {
	__u32 major; /* the disk, as in mw_origin_key */
	__u32 minor;
	__u32 origin_major;
	__u32 origin_minor;
	__u32 op;
	__u32 source; /* MW_CG_* */
	__u64 diskseq;
	__u64 cgroup; /* cgroup v2 id (kernfs node id), 0 = none */
};

struct mw_dev_stats {
	/*
	 * Bytes per request dispatched to the driver (block_rq_issue), counted at dispatch
	 * except the dispatch that follows a requeue (block_rq_requeue marks the request's
	 * in-flight slot): SCSI busy, NVMe reset or path failover dispatch a request again, and
	 * /sys/block/X/stat counts it once. Flushes and passthrough commands are not I/O here
	 * (MW_CNT_FLUSH/MW_CNT_PASSTHROUGH).
	 */
	__u64 size_slots[MW_SIZE_SLOTS];
	__u64 size_sum_bytes;
	/* block_rq_issue -> final block_rq_complete (device time) */
	__u64 latency_slots[MW_LAT_SLOTS];
	__u64 latency_sum_ns;
	/* block_rq_insert -> block_rq_issue (scheduler queue time); only where insert fires */
	__u64 queue_latency_slots[MW_LAT_SLOTS];
	__u64 queue_latency_sum_ns;
	__u64 back_merges;
	__u64 front_merges;
	/*
	 * New requests (block_getrq) for bios the kernel could have back-merged and did not:
	 * contiguous with the newest request of the same queue in the submitting task's plug,
	 * or with a request still in the queue's I/O scheduler, and mergeable by the kernel's
	 * rules (include/mergewatch/merge_rules.h). A neighbour in another task's plug does
	 * not count: no setting merges across plugs.
	 */
	__u64 missed_merges;
	/* block_bio_queue on bio-based devices (dm, md): bytes per bio the device received */
	__u64 bio_size_slots[MW_SIZE_SLOTS];
	__u64 bio_size_sum_bytes;
	/*
	 * Runs of contiguous, mergeable bios (same plug or scheduler queue, kernel merge rules)
	 * that contained at least one missed merge, and the bytes those runs would have formed
	 * as requests had merging happened (each run capped by the queue's limits): the size
	 * merging would have built, which the detector compares with the size dispatched.
	 */
	__u64 missed_merge_runs;
	__u64 missed_merge_run_bytes;
	/*
	 * Requests of this device and op counted above (size_slots) whose latency sample was lost,
	 * by reason: no in-flight slot at dispatch (inflight_map_full), or dispatched again with
	 * neither a completion nor a requeue seen since (complete_not_seen, charged to the device
	 * and op of the dispatch that lost it). Once I/O stops and every request has been reused,
	 * size count = latency count + these two; the host-wide event_counts keep
	 * counting the same events for every device.
	 */
	__u64 latency_lost_inflight_full;
	__u64 latency_lost_not_seen;
	/*
	 * Of the latency samples above, how many each clock path timed (docs/design/request-clock.md):
	 * the kernel's own dispatch stamp (rq->io_start_time_ns, where it is within MW_STAMP_BOUND_NS of
	 * the dispatch) and the dispatch clock table (the dispatch's bpf_ktime_get_ns(), stored without a
	 * read) and the in-flight table (queues with a scheduler, or --bpf.request-clock=table).
	 */
	__u64 timed_kernel_stamp;
	__u64 timed_dispatch_clock;
	__u64 timed_inflight_table;
};

/* Indexes of the per-CPU event counter array: what the daemon reports as dropped or unmatched. */
#define MW_CNT_INFLIGHT_FULL 0     /* a request could not be tracked: the in-flight map was full */
#define MW_CNT_STATS_FULL 1        /* a device/op got a stats slot in neither dev_stats nor its spill map */
#define MW_CNT_COMPLETE_UNMATCHED 2 /* a data completion whose issue was not seen: issued before attach */
#define MW_CNT_NO_DISK 3           /* a data request without a gendisk, not attributed */
#define MW_CNT_ORIGIN_FULL 4       /* a remapped request not attributed: neither origin_stats nor its spill took it */
#define MW_CNT_COMPLETE_NOT_SEEN 5 /* a request dispatched again with no completion or requeue seen since: untimed */
/* Indexes from here on are traffic that is not block I/O, not lost events. */
#define MW_CNT_FIRST_NOT_LOST 6
#define MW_CNT_FLUSH 6             /* REQ_OP_FLUSH requests dispatched (empty flushes, flush sequences) */
#define MW_CNT_PASSTHROUGH 7       /* REQ_OP_DRV_IN/OUT dispatched (SG_IO, NVMe admin/ioctl commands) */
#define MW_CNT_MAX 8

/*
 * The dispatch clock table (queues without an I/O scheduler whose kernel stamp would not be exact):
 * written only by the dispatch, with a blind store to the request's one slot, never read there, so
 * the dispatch never waits for a line another CPU wrote; read only by the completion, which takes
 * the record only if it is this dispatch's: the same request, the same allocation (start_ns) and
 * the stamp the kernel was to write (kernel_stamp; not checked where the kernel reads its clock afresh
 * after the dispatch, bpf/request_clock.bpf.h). A request whose slot another took meanwhile is untimed
 * (mergewatch_request_latency_untimed).
 */
struct mw_dispatch_clock {
	__u64 rq;           /* struct request pointer */
	__u64 issue_ns;     /* bpf_ktime_get_ns() at block_rq_issue */
	__u64 kernel_stamp; /* the rq->io_start_time_ns the kernel was to leave at this dispatch */
	__u64 start_ns;     /* rq->start_time_ns at dispatch: this allocation of the request */
	__u32 devt;         /* MW_MKDEV of the disk */
	__u32 op;
	__u32 origin;       /* dev_t of the upper device, 0 = none (as mw_inflight.origin) */
	__u32 pad;
	__u64 diskseq;
	__u64 pad2;         /* one cache line a slot */
};

/* How requests on queues without a scheduler are timed (the programs' request_clock, --bpf.request-clock). */
#define MW_CLOCK_TABLE 0    /* the in-flight table, as on queues with a scheduler */
#define MW_CLOCK_DISPATCH 1 /* the dispatch clock table always */
#define MW_CLOCK_STAMPS 2   /* the kernel's stamp where it will be exact, else the dispatch clock table */

/* A dispatch's kernel stamp is taken where it is at most this far from the dispatch's own clock. */
#define MW_STAMP_BOUND_NS 1000ull

/* mw_inflight.op of a dispatch without a gendisk: no REQ_OP_* value (they fit MW_REQ_OP_MASK). */
#define MW_SLOT_NO_DISK 0xffffffffu

/* In-flight request state: one slot of the in-flight table, owned by the request at `rq`. */
struct mw_inflight {
	__u64 rq; /* struct request pointer; 0 = free */
	__u64 insert_ns;
	__u64 issue_ns;
	__u32 requeued; /* 1 between block_rq_requeue and the dispatch after it: already counted */
	/*
	 * The device and op of the last dispatch (valid while issue_ns != 0), decided once at dispatch:
	 * the completion's key, and who a lost sample belongs to. op MW_SLOT_NO_DISK: the request had
	 * no gendisk (counted as no_disk, not timed).
	 */
	__u32 op;
	__u32 devt;   /* MW_MKDEV of the disk */
	__u32 origin; /* dev_t of the upper device the request's first bio came from, 0 = none */
	__u64 diskseq;
};

/* Smallest k with 2^k >= v (0 for v <= 1). Branch-light so BPF and C++ share it. */
static __always_inline __u32 mw_log2_ceil(__u64 v)
{
	__u32 shift, r = 0;

	if (v <= 1)
		return 0;
	v--;
	shift = (v > 0xFFFFFFFFull) << 5; v >>= shift; r |= shift;
	shift = (v > 0xFFFF) << 4; v >>= shift; r |= shift;
	shift = (v > 0xFF) << 3; v >>= shift; r |= shift;
	shift = (v > 0xF) << 2; v >>= shift; r |= shift;
	shift = (v > 0x3) << 1; v >>= shift; r |= shift;
	r |= (__u32)(v >> 1);
	return r + 1;
}

/* Histogram slot for a value given the first bucket's shift and the slot count (last = overflow). */
static __always_inline __u32 mw_hist_slot(__u64 v, __u32 min_shift, __u32 slots)
{
	__u32 k = mw_log2_ceil(v);

	if (k <= min_shift)
		return 0;
	k -= min_shift;
	return k < slots - 1 ? k : slots - 1;
}

#ifdef __cplusplus
static_assert(sizeof(struct mw_dev_key) == 24, "mw_dev_key layout");
static_assert(sizeof(struct mw_origin_key) == 32, "mw_origin_key layout");
static_assert(sizeof(struct mw_inflight) == 48, "mw_inflight layout");
static_assert(sizeof(struct mw_dispatch_clock) == 64, "mw_dispatch_clock layout");
static_assert(sizeof(struct mw_service_key) == 40, "mw_service_key layout");
static_assert(sizeof(struct mw_origin_stats) == 8 * (8 + MW_LAT_SLOTS + 1), "mw_origin_stats has no padding");
static_assert(sizeof(struct mw_dev_stats) ==
		      8 * (2 * (MW_SIZE_SLOTS + 1) + 2 * (MW_LAT_SLOTS + 1) + 10),
	      "mw_dev_stats has no padding");
#else
_Static_assert(sizeof(struct mw_dev_key) == 24, "mw_dev_key layout");
_Static_assert(sizeof(struct mw_origin_key) == 32, "mw_origin_key layout");
_Static_assert(sizeof(struct mw_inflight) == 48, "mw_inflight layout");
_Static_assert(sizeof(struct mw_dispatch_clock) == 64, "mw_dispatch_clock layout");
_Static_assert(sizeof(struct mw_service_key) == 40, "mw_service_key layout");
_Static_assert(sizeof(struct mw_origin_stats) == 8 * (8 + MW_LAT_SLOTS + 1), "mw_origin_stats layout");
_Static_assert(sizeof(struct mw_dev_stats) ==
		       8 * (2 * (MW_SIZE_SLOTS + 1) + 2 * (MW_LAT_SLOTS + 1) + 10),
	       "mw_dev_stats has no padding");
#endif

#endif /* MERGEWATCH_ABI_H */
