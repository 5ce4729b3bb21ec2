// SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
/*
 * mergewatch: per-device request size, latency and merge accounting on the block
 * tracepoints. Everything is aggregated in the kernel into per-CPU histograms; the
 * daemon reads the maps at scrape time. No per-event traffic to user space.
 *
 * Two program sets share one handler each: tp_btf (typed, cheapest) and a raw_tp
 * fallback for kernels whose BTF cannot back tp_btf. Each tracepoint whose arguments
 * changed has one program per argument layout (the _q variants: the layout up to v5.10,
 * with the request_queue first), and the two that claim in-flight slots one more (the _store
 * variants, for verifiers without compare-and-exchange). The daemon enables one set and, per
 * tracepoint, the variant its BTF prototype and the verifier call for, with bpf_program__set_autoload().
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "mergewatch/abi.h"
#include "mergewatch/merge_rules.h"
/* MW_DIRECT_READ(src, a, b, c) is src->a->b->c: BPF_CORE_READ's spelling for plain loads. */
#define MW_NARG(...) MW_NARG_(__VA_ARGS__, 5, 4, 3, 2, 1, 0)
#define MW_NARG_(_1, _2, _3, _4, _5, N, ...) N
#define MW_CONCAT(a, b) MW_CONCAT_(a, b)
#define MW_CONCAT_(a, b) a##b
#define MW_ARROW2(s, a) ((s)->a)
#define MW_ARROW3(s, a, b) ((s)->a->b)
#define MW_ARROW4(s, a, b, c) ((s)->a->b->c)
#define MW_ARROW5(s, a, b, c, d) ((s)->a->b->c->d)
#define MW_DIRECT_READ(...) MW_CONCAT(MW_ARROW, MW_NARG(__VA_ARGS__))(__VA_ARGS__)

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MW_MAX_DEV_OP_KEYS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mw_dev_key);
	__type(value, struct mw_dev_stats);
} dev_stats SEC(".maps");

/*
 * A program cannot always create a key in dev_stats: without preallocation each new entry comes
 * from an allocator that can be empty at that moment. Since v6.1 that is the BPF memory
 * allocator's per-CPU free list, refilled by an irq_work after it runs low, commit ee4ed53c5eb6
 * ("bpf: Convert percpu hash map to per-cpu bpf_mem_alloc."); before, a GFP_ATOMIC allocation.
 * Measured on Debian's 6.1 (two daemons, an LV created and read 20 times): one -ENOMEM among 53
 * new keys, and in another boot the first bio of an LV was not counted (63 of 64, device_map_full
 * 1). A full map (-E2BIG) or a bucket held by the program this one interrupted (-EBUSY) refuse too.
 * Such an event is counted here instead, in a small preallocated map that never needs an
 * allocation; the daemon sums both maps per key and deletes a device's keys from both. A key
 * lands here only for the events counted while dev_stats refused it. Preallocated per-CPU
 * values are zeroed on every CPU when an element is reused, commit d3bec0138bfb ("bpf:
 * Zero-fill re-used per-cpu map element"), v5.10.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MW_SPILL_KEYS);
	__type(key, struct mw_dev_key);
	__type(value, struct mw_dev_stats);
} dev_stats_spill SEC(".maps");

/* The stats of `key` if some map holds them, never creating any. */
static __always_inline struct mw_dev_stats *existing_stats(const struct mw_dev_key *key)
{
	struct mw_dev_stats *stats = bpf_map_lookup_elem(&dev_stats, key);

	return stats ? stats : bpf_map_lookup_elem(&dev_stats_spill, key);
}

/*
 * Requests in flight: a two-way set-associative table indexed by a hash of the request
 * pointer (blk-mq preallocates its requests, so a pointer is unique while in flight).
 * An array slot is an inlined memory access; a hash map costs an update, two lookups and
 * a delete per request, about four times the BPF time (measured: BENCHMARKS.md). Size
 * is a power of two set by the daemon (--bpf.inflight-entries), with its log2 below.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MW_DEFAULT_INFLIGHT_ENTRIES);
	__type(key, __u32);
	__type(value, struct mw_inflight);
} inflight SEC(".maps");

const volatile __u32 inflight_slot_bits = 16;

/*
 * The request clock of queues without an I/O scheduler (docs/design/request-clock.md): the kernel's
 * own dispatch stamp where it will be exact, else the dispatch clock table (struct mw_dispatch_clock
 * in abi.h), indexed as the in-flight table's first way. Sized with it (--bpf.inflight-entries).
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MW_DEFAULT_INFLIGHT_ENTRIES);
	__type(key, __u32);
	__type(value, struct mw_dispatch_clock);
} dispatch_clock SEC(".maps");

/*
 * Set by the daemon from the kernel's BTF (bpf_loader.cpp, KernelStampBits): the bit of
 * QUEUE_FLAG_STATS in request_queue->queue_flags and of RQF_STATS in request->rq_flags. With the
 * queue flag set, blk_mq_start_request() stamps rq->io_start_time_ns right after block_rq_issue and
 * sets RQF_STATS. request_clock: MW_CLOCK_* (abi.h), what --bpf.request-clock and the bits allow.
 */
const volatile __u32 request_clock = MW_CLOCK_TABLE;
const volatile __u32 queue_flag_stats_bit = 0;
const volatile __u32 rqf_stats_bit = 0;

/*
 * Requests requeued (block_rq_requeue) on a queue without a scheduler, until their next dispatch,
 * which is not a new request. The dispatch looks here only while requeues_pending is not 0: a
 * requeue is rare (SCSI busy, an NVMe reset, a path failover), and a host that never requeues never
 * pays the lookup.
 */
struct mw_requeued {
	__u64 start_ns; /* rq->start_time_ns at the requeue: the same allocation of the request */
	__u64 at_ns;
};

#define MW_REQUEUED_ENTRIES 4096

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MW_REQUEUED_ENTRIES);
	__type(key, __u64);
	__type(value, struct mw_requeued);
} requeued_requests SEC(".maps");

__u64 requeues_pending = 0;

/*
 * When a dispatch on a queue without a scheduler first ran this program: a kernel stamp older than this is of
 * a request dispatched before the programs were attached, never counted, so its completion is not timed.
 */
__u64 first_clock_dispatch_ns = 0;

/* Which clock timed a request (mw_dev_stats.timed_*). */
enum mw_timed_by { MW_TIMED_BY_STAMP, MW_TIMED_BY_DISPATCH, MW_TIMED_BY_TABLE };

/* The key of a device and op as a slot records them (MW_MKDEV's dev_t). */
static __always_inline void dev_key_of(struct mw_dev_key *key, __u32 devt, __u32 op, __u64 diskseq)
{
	key->major = devt >> MW_MINORBITS;
	key->minor = devt & MW_MINORMASK;
	key->op = op;
	key->pad = 0;
	key->diskseq = diskseq;
}

/* A slot whose request has not completed for this long is taken over (a lost completion). */
#define MW_INFLIGHT_STALE_NS (60ull * 1000000000ull)

/*
 * The verifier forbids arithmetic on a typed kernel pointer (a tp_btf argument), and
 * register tricks do not fool it; a copy read back from a map value is a plain number
 * (storing a pointer into a map needs CAP_PERFMON, which loading tracing programs needs
 * anyway). The cell is per CPU and per nesting level: a completion in interrupt context
 * that runs between the write and the read-back uses the next level's cell, so it can
 * never hand its pointer to the program it interrupted (a shared cell did: a request
 * claiming another's in-flight slot). bpf_probe_read_kernel() into the stack is also
 * nest-safe but a helper call, 35-50 ns per program run (BENCHMARKS.md).
 */
#define MW_NEST_LEVELS 8 /* task, softirq, hardirq, NMI: 4 would do; the mask keeps it in bounds */

/* A plug slot of the missed-merge evidence (see "Missed merges" below). */
struct plug_slot {
	__u64 plug;     /* struct blk_plug pointer of the task; 0: the request was not plugged */
	__u64 seq;      /* the request's number in its plug (mw_plug_gen_add()) */
	__u32 queue_id; /* request_queue->id + 1; 0 = never used */
	__u32 missed;   /* the run already holds a missed merge (counted in missed_merge_runs) */
	struct mw_merge_side run; /* the request as merging would have built it */
};

#define MW_PLUG_SLOTS 16

/*
 * Everything this object keeps per CPU, in one value: one lookup per program run (MW_NESTED) reaches
 * the nesting cells and block_getrq's plug state, which were three maps and three lookups.
 */
struct mw_nest {
	__u32 depth; /* programs of this object running on this CPU, the current one included */
	__u32 pad;
	__u64 cell[MW_NEST_LEVELS];
	/*
	 * Above every plug sequence number handed out on this CPU (plug_gens): where a plug's state
	 * starts when it is created or re-created, so that it never holds a number recorded before.
	 */
	__u64 plug_seq_high;
	struct mw_plug_gen plug_gens[MW_PLUG_SLOTS]; /* by plug_gen_index() */
	struct plug_slot plug_slots[MW_PLUG_SLOTS];  /* by plug_slot_index() */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct mw_nest);
} nest_scratch SEC(".maps");

static __always_inline struct mw_nest *nest_state(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&nest_scratch, &zero);
}

/*
 * What a program run looked up once: this CPU's nest state and the run's own cell. Handlers take
 * it as their first argument, so a run that turns several pointers into numbers (block_getrq: the
 * plug, the cgroup, a bvec) does one per-CPU lookup, not one per pointer.
 */
struct mw_run {
	struct mw_nest *nest;
	volatile __u64 *cell;
};

/*
 * Every program body that turns pointers into numbers runs inside MW_NESTED(), which owns one
 * level for its duration and hands the handler `run_` (the call names it). Programs that keep no
 * pointer (block_bio_queue, the merges, block_bio_remap) run without it: a program nested in them
 * takes the next level all the same, and they touch no cell.
 */
#define MW_NESTED(call)                                                                            \
	({                                                                                         \
		struct mw_nest *nest_ = nest_state();                                              \
		int ret_ = 0;                                                                      \
		if (nest_) {                                                                       \
			struct mw_run run_ = {                                                     \
				.nest = nest_,                                                     \
				.cell = &nest_->cell[nest_->depth & (MW_NEST_LEVELS - 1)],         \
			};                                                                         \
			nest_->depth++;                                                            \
			ret_ = (call);                                                             \
			nest_->depth--;                                                            \
		}                                                                                  \
		ret_;                                                                              \
	})

static __always_inline __u64 pointer_value(const struct mw_run *run, const void *pointer)
{
	*run->cell = (__u64)pointer;
	return *run->cell;
}

/* Zero value for lookup-or-init: too large for the 512-byte BPF stack. */
static const struct mw_dev_stats zero_stats;

static __always_inline void count_event(__u32 idx);

/*
 * The dispatch held in `slot` will never be timed (see handle_rq_issue): counted host-wide and
 * for the device and op of that dispatch, which the slot recorded (the request pointer may come
 * back for another op, or for another disk of a shared tag set).
 */
static __always_inline void count_not_seen(const struct mw_inflight *slot)
{
	struct mw_dev_key key = { .major = slot->devt >> MW_MINORBITS, .minor = slot->devt & MW_MINORMASK,
				  .op = slot->op, .diskseq = slot->diskseq };
	struct mw_dev_stats *stats = existing_stats(&key);

	count_event(MW_CNT_COMPLETE_NOT_SEEN);
	if (stats)
		stats->latency_lost_not_seen++;
}

/* Free, or held by a request `seen` (the slot's rq as read) whose dispatch is stale. */
static __always_inline bool slot_claimable(const struct mw_inflight *slot, __u64 seen, __u64 now)
{
	__u64 since;

	if (seen == 0) /* the usual case: its stamps are not read */
		return true;
	since = slot->issue_ns > slot->insert_ns ? slot->issue_ns : slot->insert_ns;
	return now - since > MW_INFLIGHT_STALE_NS;
}

static __always_inline __u32 inflight_way0(__u64 rq)
{
	/* Fibonacci hashing; the low 6 bits of a request pointer carry no information. */
	return (__u32)(((rq >> 6) * 0x9E3779B97F4A7C15ull) >> (64 - inflight_slot_bits));
}

/*
 * Touch both ways of request `rq` and go on: a slot was last written by the CPU that completed or
 * dispatched its request, so the first load of it waits for the line to come over from that CPU
 * (perf on randread: 40-50% of block_rq_issue's and block_rq_complete's samples). block_rq_issue
 * starts it before the device lookup, which can run meanwhile. The loads are discarded:
 * inflight_slot_of() reads the slot again, so nothing is decided on a value that may have changed.
 */
static __always_inline void inflight_prefetch(__u64 rq)
{
	__u32 way0 = inflight_way0(rq), way1 = way0 ^ 1;
	struct mw_inflight *a = bpf_map_lookup_elem(&inflight, &way0);
	struct mw_inflight *b = bpf_map_lookup_elem(&inflight, &way1);

	if (a)
		(void)*(volatile __u64 *)&a->rq;
	if (b)
		(void)*(volatile __u64 *)&b->rq;
}

/*
 * How inflight_slot_of() treats a request the table does not hold. Two CPUs can see one slot free
 * at once (two requests of one hash pair dispatched together): with a plain store both take it,
 * the later store wins, and the other request is neither timed nor counted for its device (its
 * completion finds no slot: complete_without_issue, host-wide), while the winner's completion may read
 * the loser's device. test_requests' every-mode test saw it once in its 7.6 M requests per daemon.
 * A compare-and-exchange lets one CPU win and sends the other to the other way. BPF has it since
 * v5.12, commit 5ffa25502b5a ("bpf: Add instructions for atomic_[cmp]xchg"); the v5.10 verifier
 * refuses the instruction anywhere in a program, reachable or not ("BPF_STX uses reserved
 * fields"), so the programs of the old argument layout (_q) and the _store variants of the new one
 * keep the plain store, and the loader picks them where a probe load finds no compare-and-exchange.
 */
enum mw_slot_access {
	MW_SLOT_FIND,         /* the request's slot, or NULL */
	MW_SLOT_CLAIM_PLAIN,  /* ... else take a free or stale way with a store */
	MW_SLOT_CLAIM_ATOMIC, /* ... else take one with a compare-and-exchange */
};

/* Takes `slot`, read as holding `seen`, for `rq`; false if another CPU took it first. */
static __always_inline bool slot_take(struct mw_inflight *slot, __u64 seen, __u64 rq, __u64 now,
				      enum mw_slot_access access)
{
	if (!slot_claimable(slot, seen, now))
		return false;
	if (access == MW_SLOT_CLAIM_ATOMIC) {
		if (__sync_val_compare_and_swap(&slot->rq, seen, rq) != seen)
			return false;
	} else {
		slot->rq = rq;
	}
	/* Taken over from a dispatch with no completion for MW_INFLIGHT_STALE_NS: never timed now. */
	if (seen && slot->issue_ns && !slot->requeued)
		count_not_seen(slot);
	slot->insert_ns = 0;
	slot->issue_ns = 0;
	slot->requeued = 0;
	return true;
}

/* The slot of request `rq`; a claim takes a free or stale one of its two ways. NULL: none. */
static __always_inline struct mw_inflight *inflight_slot_of(__u64 rq, __u64 now, enum mw_slot_access access)
{
	__u32 way0 = inflight_way0(rq), way1 = way0 ^ 1;
	struct mw_inflight *a, *b;
	__u64 seen_a, seen_b;

	if (!rq)
		return NULL;
	a = bpf_map_lookup_elem(&inflight, &way0);
	if (!a)
		return NULL;
	seen_a = a->rq;
	if (seen_a == rq)
		return a;
	b = bpf_map_lookup_elem(&inflight, &way1);
	if (!b)
		return NULL;
	seen_b = b->rq;
	if (seen_b == rq)
		return b;
	if (access == MW_SLOT_FIND)
		return NULL;
	if (slot_take(a, seen_a, rq, now, access))
		return a;
	if (slot_take(b, seen_b, rq, now, access))
		return b;
	return NULL;
}

static __always_inline struct mw_inflight *inflight_slot(const struct mw_run *run, void *request, __u64 now,
							 enum mw_slot_access access)
{
	return inflight_slot_of(pointer_value(run, request), now, access);
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MW_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} event_counts SEC(".maps");

/*
 * Missed merges follow the kernel's two units of merging (block/blk-merge.c, blk-mq.c):
 *
 * 1. The submitting task's plug. blk_attempt_plug_merge() tries a new bio against one
 *    request only: the newest request of the bio's queue in current->plug. So does this:
 *    per CPU, a slot chosen by the plug's address and the queue, tagged with both and
 *    the request's number in its plug's generation count (plug_gens, struct mw_plug_gen in
 *    merge_rules.h: which requests the plug still holds, from plug->rq_count, for plugs of
 *    one queue or several, md RAID0/10 and striped LVs). A task that migrates
 *    to another CPU, or whose slot another plugging task took meanwhile, finds a foreign
 *    tag and starts a new run: an undercount, never a merge claimed across two tasks'
 *    plugs (no setting merges those). Plugs live on kernel stacks (16 KiB apart and
 *    aligned), so the stack's address above bit 14 tells tasks apart.
 * 2. With an I/O scheduler, the scheduler's queue, shared by every task: elv_merge()
 *    finds a back-merge candidate by its end sector (elv_rqhash). sched_queued is that
 *    hash: requests are entered at block_rq_insert under (queue, end sector) and removed
 *    at dispatch; a hit is confirmed by request identity (the in-flight table still shows
 *    that request inserted and not issued), so an entry left by a request that was merged
 *    away or grew by a back merge can never count.
 */

static __always_inline __u32 plug_slot_index(__u64 plug_id, __u32 queue_id)
{
	return (__u32)((plug_id >> 14) ^ (plug_id >> 24) ^ queue_id) & (MW_PLUG_SLOTS - 1);
}

/* The slots are per CPU in mw_nest.plug_slots. */

/* What block_getrq found, for the origin's share of the evidence (count_origin()). */
struct mw_getrq_evidence {
	__u64 sector;         /* the bio's first sector */
	__u64 bytes;          /* the bio's bytes */
	__u64 run_bytes;      /* bytes added to missed_merge_run_bytes */
	__u32 missed;         /* a missed merge */
	__u32 run_started;    /* the first missed merge of its run: missed_merge_runs + 1 */
};

/* Per CPU, one generation count per plug (by the plug's address), tagged with it. */
static __always_inline __u32 plug_gen_index(__u64 plug_id)
{
	return (__u32)((plug_id >> 14) ^ (plug_id >> 24)) & (MW_PLUG_SLOTS - 1);
}

/* The generation counts are per CPU in mw_nest.plug_gens. */

struct sched_key {
	__u32 queue_id;
	__u32 pad;
	__u64 end_sector;
};

struct sched_entry {
	__u64 rq; /* request pointer, the identity checked against the in-flight table */
	__u32 missed;
	__u32 pad;
	struct mw_merge_side run;
};

#define MW_SCHED_ENTRIES 16384

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MW_SCHED_ENTRIES);
	__type(key, struct sched_key);
	__type(value, struct sched_entry);
} sched_queued SEC(".maps");

/* Scratch for building a scheduler entry (enter_scheduler): too large for the BPF stack beside the rest. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sched_entry);
} sched_scratch SEC(".maps");

/* The kernel's __REQ_* bit for `name`, mapped to MW_F_* at load time (CO-RE enum relocation). */
#define MW_REQ_FLAG(opf, name, mw_flag)                                                            \
	((bpf_core_enum_value_exists(enum req_flag_bits, name) &&                                   \
	  (((__u64)(opf) >> bpf_core_enum_value(enum req_flag_bits, name)) & 1))                    \
		 ? (mw_flag)                                                                        \
		 : 0u)

static __always_inline __u32 mw_norm_flags(__u64 opf)
{
	return MW_REQ_FLAG(opf, __REQ_NOMERGE, MW_F_NOMERGE) | MW_REQ_FLAG(opf, __REQ_FUA, MW_F_FUA) |
	       MW_REQ_FLAG(opf, __REQ_PREFLUSH, MW_F_PREFLUSH) |
	       MW_REQ_FLAG(opf, __REQ_INTEGRITY, MW_F_INTEGRITY) | MW_REQ_FLAG(opf, __REQ_META, MW_F_META) |
	       MW_REQ_FLAG(opf, __REQ_SWAP, MW_F_SWAP) | MW_REQ_FLAG(opf, __REQ_ATOMIC, MW_F_ATOMIC);
}

/*
 * The remap chain, one hop at a time: each block_bio_remap leaves (the device and sector
 * the bio now addresses) -> (the device the chain started at, when). The next hop reads the
 * entry and leaves it: md RAID1/10 clones a write to every mirror, and each clone's remap
 * starts from the same md hop (raid1_write_request() traces one remap per leg), so taking
 * it would follow the first leg only. The request the bio finally becomes (block_getrq)
 * takes its own entry. An entry older than MW_REMAP_MAX_AGE_NS is no chain: a leftover (a
 * hop no clone asked for again, a bio that merged into an existing request, a device since
 * removed) must not claim a later bio that happens to address the same sector, such as a
 * member disk's own superblock I/O after the LV that left it is gone. LRU drops the rest.
 */
#define MW_REMAP_MAX_AGE_NS (2ULL * 1000 * 1000 * 1000)
/*
 * A request's entry (remap_link.for_dispatch) waits for its dispatch longer: a request may sit in
 * an I/O scheduler for seconds (mq-deadline's write_expire is 5 s). Older, it is a leftover.
 */
#define MW_DISPATCH_MAX_AGE_NS (30ULL * 1000 * 1000 * 1000)

struct remap_key {
	__u32 devt;
	__u32 pad;
	__u64 sector;
};

struct remap_link {
	__u32 origin; /* dev_t the chain started at */
	__u8 cgroup_source; /* MW_CG_* of `cgroup` */
	/*
	 * 1: no hop but the request block_getrq made for the bio (or a front merge moved to it),
	 * left for its dispatch, which takes it (the pair's per-volume counts and latency). Not a
	 * chain: block_getrq and the merges pass over it.
	 */
	__u8 for_dispatch;
	__u16 pad;
	__u64 at_ns;  /* bpf_ktime_get_ns() of the hop that left it */
	__u64 cgroup; /* who submitted the chain's top bio (chain_cgroup()) */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MW_REMAP_ENTRIES);
	__type(key, struct remap_key);
	__type(value, struct remap_link);
} remap_origin SEC(".maps");

/* `link`, the chain entry looked up at `at`, if a hop left it within MW_REMAP_MAX_AGE_NS of `now_ns`;
 * an older one is deleted. The caller looks up first and reads the clock only for an entry it found
 * or a hop it stores. */
static __always_inline struct remap_link *fresh_remap_link(struct remap_key *at, struct remap_link *link,
							   __u64 now_ns)
{
	if (!link)
		return NULL;
	if (now_ns - link->at_ns <= MW_REMAP_MAX_AGE_NS)
		return link;
	bpf_map_delete_elem(&remap_origin, at);
	return NULL;
}

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MW_MAX_ORIGIN_KEYS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct mw_origin_key);
	__type(value, struct mw_origin_stats);
} origin_stats SEC(".maps");

/* What origin_stats could not take, as dev_stats_spill for dev_stats. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, MW_SPILL_KEYS);
	__type(key, struct mw_origin_key);
	__type(value, struct mw_origin_stats);
} origin_spill SEC(".maps");

/*
 * Requests per (disk, upper device, op, cgroup): the services behind a pair. LRU: on a host with
 * more live (pair, cgroup) keys than this, the least recently counted start from 0 again, which the
 * daemon's window reads as a reset (ServiceWindow), never as a loss of the pair's own counts.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, MW_MAX_SERVICE_KEYS);
	__type(key, struct mw_service_key);
	__type(value, __u64);
} service_counts SEC(".maps");

/*
 * Set by the daemon before load. cgroup_root_id: the id of the cgroup2 root (1 on 64-bit), whose
 * tasks are kernel threads on a systemd host. blkcg_on_cgroup2: the io controller's hierarchy is
 * the default one, so a bio's blkcg id names a cgroup2 directory (on a v1 blkio hierarchy it is an
 * id of another idr: never read then).
 */
const volatile __u64 cgroup_root_id = 1;
const volatile __u32 blkcg_on_cgroup2 = 0;

/* Set once a stacking driver remapped a bio: until then no request pays for the lookup. */
__u32 remaps_seen = 0;

static __always_inline void count_event(__u32 idx)
{
	__u64 *cnt = bpf_map_lookup_elem(&event_counts, &idx);

	if (cnt)
		(*cnt)++;
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

/* The key of the pair (the disk as the event keyed it, op and diskseq included; the upper device's dev_t). */
static __always_inline void pair_key(struct mw_origin_key *pair, const struct mw_dev_key *disk, __u32 origin)
{
	pair->major = disk->major;
	pair->minor = disk->minor;
	pair->origin_major = origin >> MW_MINORBITS;
	pair->origin_minor = origin & MW_MINORMASK;
	pair->op = disk->op;
	pair->pad = 0;
	pair->diskseq = disk->diskseq;
}

/* The (disk, upper device) pair's slot: origin_stats, else its spill map; created if `create`. */
static __always_inline struct mw_origin_stats *origin_stats_at(const struct mw_origin_key *key, bool create)
{
	static const struct mw_origin_stats zero;
	struct mw_origin_stats *stats;

	stats = bpf_map_lookup_elem(&origin_stats, key);
	if (stats || !create)
		return stats ? stats : bpf_map_lookup_elem(&origin_spill, key);
	bpf_map_update_elem(&origin_stats, key, &zero, BPF_NOEXIST);
	stats = bpf_map_lookup_elem(&origin_stats, key);
	if (stats)
		return stats;
	/* origin_stats refused to make it (see stats_of_key): the spill map counts it */
	stats = bpf_map_lookup_elem(&origin_spill, key);
	if (stats)
		return stats;
	bpf_map_update_elem(&origin_spill, key, &zero, BPF_NOEXIST);
	stats = bpf_map_lookup_elem(&origin_spill, key);
	if (!stats)
		count_event(MW_CNT_ORIGIN_FULL);
	return stats;
}

/* One more request of `pair` from the cgroup that submitted its chain. */
static __always_inline void count_service(const struct mw_origin_key *pair, const struct remap_link *chain)
{
	struct mw_service_key key = {
		.major = pair->major, .minor = pair->minor,
		.origin_major = pair->origin_major, .origin_minor = pair->origin_minor,
		.op = pair->op, .source = chain->cgroup_source, .diskseq = pair->diskseq, .cgroup = chain->cgroup,
	};
	static const __u64 one = 1;
	__u64 *requests = bpf_map_lookup_elem(&service_counts, &key);

	if (requests) {
		(*requests)++;
		return;
	}
	if (bpf_map_update_elem(&service_counts, &key, &one, BPF_NOEXIST) == 0)
		return;
	/* another CPU made it meanwhile */
	requests = bpf_map_lookup_elem(&service_counts, &key);
	if (requests)
		(*requests)++;
}

/* tp_btf: typed arguments, direct loads */
#define MW_FN(name) name##_btf
#define MW_READ MW_DIRECT_READ
#define MW_READ_BITFIELD BPF_CORE_READ_BITFIELD
#define MW_TYPED_ARGS 1
#include "handlers.bpf.h"
#undef MW_FN
#undef MW_READ
#undef MW_READ_BITFIELD
#undef MW_TYPED_ARGS

/* raw_tp fallback: the same handlers reading through bpf_probe_read_kernel */
#define MW_FN(name) name##_raw
#define MW_READ BPF_CORE_READ
#define MW_READ_BITFIELD BPF_CORE_READ_BITFIELD_PROBED
#include "handlers.bpf.h"
#undef MW_FN
#undef MW_READ
#undef MW_READ_BITFIELD

/*
 * One program per argument layout, each reading ctx at constant offsets. A position chosen
 * at run time (even from a .rodata constant) compiles to a ctx pointer plus an offset, and
 * the verifier refuses any load through a modified ctx pointer ("dereference of modified ctx
 * ptr R7 off=16 disallowed", check_ctx_reg() in kernel/bpf/verifier.c, as of 5.10 and since).
 * The layouts: v5.11 dropped the request_queue argument of the request and bio tracepoints,
 * commit a54895fa057c ("block: remove the request_queue to argument request based tracepoints"),
 * commit e8a676d61c07 ("block: simplify and extend the block_bio_merge tracepoint class"),
 * commit 1c02fca620f7 ("block: remove the request_queue argument to the block_bio_remap
 * tracepoint"), and the same series for block_bio_queue and block_getrq. The daemon picks the
 * variant from the btf_trace_<tp> prototype's arity (bpf_loader.cpp, ChooseVariants), never
 * from a version: distributions backport such changes.
 *
 * <prefix>_<name> is for the v5.11+ layout and <prefix>_<name>_q for the layout with the request_queue
 * first. block_rq_insert and block_rq_issue, which claim in-flight slots, have a third: _store, the
 * v5.11+ layout claiming with a plain store, for a kernel whose verifier has no compare-and-exchange
 * (enum mw_slot_access; Debian's 5.10 has the new layout of the request tracepoints backported).
 */
#define MW_BTF_PROG(tp, name, call)                                                                \
	SEC("tp_btf/" tp)                                                                          \
	int BPF_PROG(name) { return MW_NESTED(call); }
#define MW_RAW_PROG(tp, name, call)                                                                \
	SEC("raw_tp/" tp)                                                                          \
	int name(__u64 *ctx) { return MW_NESTED(call); }
/* The programs that keep no pointer: no nesting level (MW_NESTED). */
#define MW_BTF_PROG_PLAIN(tp, name, call)                                                          \
	SEC("tp_btf/" tp)                                                                          \
	int BPF_PROG(name) { return (call); }
#define MW_RAW_PROG_PLAIN(tp, name, call)                                                          \
	SEC("raw_tp/" tp)                                                                          \
	int name(__u64 *ctx) { return (call); }

/* block_rq_insert/issue/requeue: (rq) or (q, rq) */
MW_BTF_PROG("block_rq_insert", btf_rq_insert, handle_rq_insert_btf(&run_, (struct request *)ctx[0], MW_SLOT_CLAIM_ATOMIC))
MW_BTF_PROG("block_rq_insert", btf_rq_insert_store, handle_rq_insert_btf(&run_, (struct request *)ctx[0], MW_SLOT_CLAIM_PLAIN))
MW_BTF_PROG("block_rq_insert", btf_rq_insert_q, handle_rq_insert_btf(&run_, (struct request *)ctx[1], MW_SLOT_CLAIM_PLAIN))
MW_BTF_PROG("block_rq_issue", btf_rq_issue, handle_rq_issue_btf(&run_, (struct request *)ctx[0], MW_SLOT_CLAIM_ATOMIC))
MW_BTF_PROG("block_rq_issue", btf_rq_issue_store, handle_rq_issue_btf(&run_, (struct request *)ctx[0], MW_SLOT_CLAIM_PLAIN))
MW_BTF_PROG("block_rq_issue", btf_rq_issue_q, handle_rq_issue_btf(&run_, (struct request *)ctx[1], MW_SLOT_CLAIM_PLAIN))
MW_BTF_PROG("block_rq_requeue", btf_rq_requeue, handle_rq_requeue_btf(&run_, (struct request *)ctx[0]))
MW_BTF_PROG("block_rq_requeue", btf_rq_requeue_q, handle_rq_requeue_btf(&run_, (struct request *)ctx[1]))
/* (rq, error, nr_bytes) since v4.13; raw_tp/tp_btf need 4.17+ anyway: one layout. */
MW_BTF_PROG("block_rq_complete", btf_rq_complete, handle_rq_complete_btf(&run_, (void *)ctx[0], (__u32)ctx[2]))
/* block_bio_back/frontmerge: (bio) or (q, rq, bio) */
MW_BTF_PROG_PLAIN("block_bio_backmerge", btf_bio_backmerge, handle_bio_merge_btf((struct bio *)ctx[0], true))
MW_BTF_PROG_PLAIN("block_bio_backmerge", btf_bio_backmerge_q, handle_bio_merge_btf((struct bio *)ctx[2], true))
MW_BTF_PROG_PLAIN("block_bio_frontmerge", btf_bio_frontmerge, handle_bio_merge_btf((struct bio *)ctx[0], false))
MW_BTF_PROG_PLAIN("block_bio_frontmerge", btf_bio_frontmerge_q, handle_bio_merge_btf((struct bio *)ctx[2], false))
/* block_bio_queue: (bio) or (q, bio) */
MW_BTF_PROG_PLAIN("block_bio_queue", btf_bio_queue, handle_bio_queue_btf((struct bio *)ctx[0]))
MW_BTF_PROG_PLAIN("block_bio_queue", btf_bio_queue_q, handle_bio_queue_btf((struct bio *)ctx[1]))
/* block_getrq: (bio) or (q, bio, rw) */
MW_BTF_PROG("block_getrq", btf_getrq, handle_getrq_btf(&run_, (struct bio *)ctx[0]))
MW_BTF_PROG("block_getrq", btf_getrq_q, handle_getrq_btf(&run_, (struct bio *)ctx[1]))
/* block_bio_remap: (bio, dev, from) or (q, bio, dev, from) */
MW_BTF_PROG_PLAIN("block_bio_remap", btf_bio_remap, handle_bio_remap_btf((struct bio *)ctx[0], (__u32)ctx[1], ctx[2]))
MW_BTF_PROG_PLAIN("block_bio_remap", btf_bio_remap_q, handle_bio_remap_btf((struct bio *)ctx[1], (__u32)ctx[2], ctx[3]))

MW_RAW_PROG("block_rq_insert", raw_rq_insert, handle_rq_insert_raw(&run_, (struct request *)ctx[0], MW_SLOT_CLAIM_ATOMIC))
MW_RAW_PROG("block_rq_insert", raw_rq_insert_store, handle_rq_insert_raw(&run_, (struct request *)ctx[0], MW_SLOT_CLAIM_PLAIN))
MW_RAW_PROG("block_rq_insert", raw_rq_insert_q, handle_rq_insert_raw(&run_, (struct request *)ctx[1], MW_SLOT_CLAIM_PLAIN))
MW_RAW_PROG("block_rq_issue", raw_rq_issue, handle_rq_issue_raw(&run_, (struct request *)ctx[0], MW_SLOT_CLAIM_ATOMIC))
MW_RAW_PROG("block_rq_issue", raw_rq_issue_store, handle_rq_issue_raw(&run_, (struct request *)ctx[0], MW_SLOT_CLAIM_PLAIN))
MW_RAW_PROG("block_rq_issue", raw_rq_issue_q, handle_rq_issue_raw(&run_, (struct request *)ctx[1], MW_SLOT_CLAIM_PLAIN))
MW_RAW_PROG("block_rq_requeue", raw_rq_requeue, handle_rq_requeue_raw(&run_, (struct request *)ctx[0]))
MW_RAW_PROG("block_rq_requeue", raw_rq_requeue_q, handle_rq_requeue_raw(&run_, (struct request *)ctx[1]))
MW_RAW_PROG("block_rq_complete", raw_rq_complete, handle_rq_complete_raw(&run_, (void *)ctx[0], (__u32)ctx[2]))
MW_RAW_PROG_PLAIN("block_bio_backmerge", raw_bio_backmerge, handle_bio_merge_raw((struct bio *)ctx[0], true))
MW_RAW_PROG_PLAIN("block_bio_backmerge", raw_bio_backmerge_q, handle_bio_merge_raw((struct bio *)ctx[2], true))
MW_RAW_PROG_PLAIN("block_bio_frontmerge", raw_bio_frontmerge, handle_bio_merge_raw((struct bio *)ctx[0], false))
MW_RAW_PROG_PLAIN("block_bio_frontmerge", raw_bio_frontmerge_q, handle_bio_merge_raw((struct bio *)ctx[2], false))
MW_RAW_PROG_PLAIN("block_bio_queue", raw_bio_queue, handle_bio_queue_raw((struct bio *)ctx[0]))
MW_RAW_PROG_PLAIN("block_bio_queue", raw_bio_queue_q, handle_bio_queue_raw((struct bio *)ctx[1]))
MW_RAW_PROG("block_getrq", raw_getrq, handle_getrq_raw(&run_, (struct bio *)ctx[0]))
MW_RAW_PROG("block_getrq", raw_getrq_q, handle_getrq_raw(&run_, (struct bio *)ctx[1]))
MW_RAW_PROG_PLAIN("block_bio_remap", raw_bio_remap, handle_bio_remap_raw((struct bio *)ctx[0], (__u32)ctx[1], ctx[2]))
MW_RAW_PROG_PLAIN("block_bio_remap", raw_bio_remap_q, handle_bio_remap_raw((struct bio *)ctx[1], (__u32)ctx[2], ctx[3]))
