/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * The handlers, compiled once per program flavor (mergewatch.bpf.c includes this file
 * twice): MW_FN(name) gives each flavor its own names, MW_READ(src, a, b...) reads
 * src->a->b (MW_READ_BITFIELD a bitfield the same way). tp_btf arguments are typed kernel pointers, so plain loads work (the
 * verifier makes them fault-safe) and cost a few ns; raw_tp arguments are plain numbers
 * and need bpf_probe_read_kernel (BPF_CORE_READ), several times slower per field.
 * No include guard: that is the point.
 */
#include "core_fixes.bpf.h"

/*
 * The stats slot of `key`, made if missing: in dev_stats, or where dev_stats refused to make it
 * (ENOMEM, E2BIG, EBUSY: mergewatch.bpf.c, dev_stats_spill) in the spill map. NULL (counted)
 * only when both refuse.
 */
static __always_inline struct mw_dev_stats *MW_FN(stats_of_key)(const struct mw_dev_key *key)
{
	struct mw_dev_stats *stats = bpf_map_lookup_elem(&dev_stats, key);

	if (stats)
		return stats;
	/* EEXIST from a racing CPU is fine: the lookup below finds its entry. */
	bpf_map_update_elem(&dev_stats, key, &zero_stats, BPF_NOEXIST);
	stats = bpf_map_lookup_elem(&dev_stats, key);
	if (stats)
		return stats;
	stats = bpf_map_lookup_elem(&dev_stats_spill, key);
	if (stats)
		return stats;
	bpf_map_update_elem(&dev_stats_spill, key, &zero_stats, BPF_NOEXIST);
	stats = bpf_map_lookup_elem(&dev_stats_spill, key);
	if (!stats)
		count_event(MW_CNT_STATS_FULL);
	return stats;
}

/* The stats of (disk, op); `key` (may be NULL) receives the key. */
/* The key of (disk, op): the disk's fields, read once per event and shared by whatever the event counts. */
static __always_inline void MW_FN(disk_key)(struct gendisk *disk, __u32 op, struct mw_dev_key *key)
{
	key->major = MW_READ(disk, major);
	key->minor = MW_READ(disk, first_minor);
	key->op = op & MW_REQ_OP_MASK;
	key->pad = 0;
	key->diskseq = MW_FN(mw_disk_seq)(disk);
}

static __always_inline struct mw_dev_stats *MW_FN(stats_for_key)(struct gendisk *disk, __u32 op,
								  struct mw_dev_key *key)
{
	if (!disk) {
		count_event(MW_CNT_NO_DISK);
		return NULL;
	}
	MW_FN(disk_key)(disk, op, key);
	return MW_FN(stats_of_key)(key);
}

static __always_inline struct mw_dev_stats *MW_FN(stats_for)(struct gendisk *disk, __u32 op)
{
	struct mw_dev_key key = {};

	return MW_FN(stats_for_key)(disk, op, &key);
}

/*
 * The bvec at `index` of the bio's vector. The first is a constant offset from the typed
 * pointer: plain loads in tp_btf. Any other is read by address (an index into a typed pointer
 * is refused), a helper call: on a queue with a virt boundary (NVMe) that was two calls per bio
 * for the first and the last bvec, where a 4 KiB bio has only one.
 */
static __always_inline void MW_FN(read_bvec)(const struct mw_run *run, struct bio *bio, __u32 index,
					      struct bio_vec *out)
{
	struct bio_vec *vec = MW_READ(bio, bi_io_vec);
	__u64 base;

	out->bv_offset = 0;
	out->bv_len = 0;
	if (!vec)
		return;
	if (index == 0) {
		out->bv_offset = MW_READ(vec, bv_offset);
		out->bv_len = MW_READ(vec, bv_len);
		return;
	}
	base = pointer_value(run, vec);
	bpf_probe_read_kernel(out, sizeof(*out), (void *)(base + (__u64)index * sizeof(struct bio_vec)));
}

#define MW_PAGE_SIZE 4096u /* x86-64 and 4K arm64: the unit bvecs are built from */

/*
 * The bio as one side of a merge (merge_rules.h). `need_offsets`: the queue has a virt
 * boundary, so where the data starts and ends in its pages matters.
 */
static __always_inline void MW_FN(bio_side)(const struct mw_run *run, struct bio *bio, __u32 opf, bool need_offsets, __u32 max_segment_size,
					    struct mw_merge_side *b)
{
	struct bio___with_crypt *crypt = (void *)bio;
	struct bio___with_write_hint *hinted = (void *)bio;
	struct bio___with_blkg *grouped = (void *)bio;
	__u32 bytes = MW_READ(bio, bi_iter.bi_size), vcnt = MW_READ(bio, bi_vcnt);
	__u32 idx = MW_READ(bio, bi_iter.bi_idx), done = MW_READ(bio, bi_iter.bi_bvec_done);
	bool whole = vcnt > 0 && idx == 0 && done == 0;
	struct bio_vec bv;

	b->sector = MW_READ(bio, bi_iter.bi_sector);
	b->sectors = bytes >> 9;
	b->op = opf & MW_REQ_OP_MASK;
	b->flags = mw_norm_flags(opf);
	b->ioprio = MW_READ(bio, bi_ioprio);
	b->write_hint = 0;
	if (bpf_core_field_exists(hinted->bi_write_hint))
		b->write_hint = (__u32)MW_READ_BITFIELD(hinted, bi_write_hint);
	b->blkg = 0;
	if (bpf_core_field_exists(grouped->bi_blkg))
		b->blkg = pointer_value(run, MW_READ(grouped, bi_blkg));
	if (bpf_core_field_exists(crypt->bi_crypt_context) && MW_READ(crypt, bi_crypt_context))
		b->flags |= MW_F_CRYPT;
	b->first_offset = 0;
	b->last_end = 0;
	if (b->op == MW_OP_DISCARD || b->op == MW_OP_SECURE_ERASE || bytes == 0) {
		b->segments = 1; /* a discard range is one segment (blk_rq_get_max_segments) */
		return;
	}
	/*
	 * Segments, from above, so a merge is never claimed that the segment limit stops: a bio
	 * built by the submitter from its bvecs and their sizes (mw_whole_bio_segments()); clones
	 * and split bios (dm, md, block-layer splits) share the parent's vector and have bi_vcnt 0
	 * or a moved iterator: there the pages the data spans.
	 */
	if (whole && !need_offsets) {
		b->segments = mw_whole_bio_segments(vcnt, bytes, max_segment_size);
		return;
	}
	MW_FN(read_bvec)(run, bio, idx, &bv);
	b->first_offset = bv.bv_offset + done;
	b->segments = whole ? mw_whole_bio_segments(vcnt, bytes, max_segment_size)
			    : ((b->first_offset & (MW_PAGE_SIZE - 1)) + bytes + MW_PAGE_SIZE - 1) / MW_PAGE_SIZE;
	if (whole) {
		if (vcnt > 1) /* else the last bvec is the first, read above */
			MW_FN(read_bvec)(run, bio, vcnt - 1, &bv);
		b->last_end = bv.bv_offset + bv.bv_len;
	} else {
		/* the last bvec is not at a known index: assume the data runs on contiguously */
		b->last_end = b->first_offset + bytes;
	}
}

/*
 * The limits a merge candidate is judged by, but virt_boundary_mask, which block_getrq read for the
 * bio already. max_write_zeroes_sectors is left 0: write zeroes is never mergeable
 * (mw_back_merge_verdict() refuses the op before any size limit), so it was read for nothing.
 */
static __always_inline void MW_FN(queue_limits)(struct request_queue *q, struct mw_merge_limits *lim)
{
	lim->max_sectors = MW_READ(q, limits.max_sectors);
	lim->max_discard_sectors = MW_READ(q, limits.max_discard_sectors);
	lim->max_write_zeroes_sectors = 0;
	lim->chunk_sectors = MW_READ(q, limits.chunk_sectors);
	lim->max_segments = MW_READ(q, limits.max_segments);
	lim->max_discard_segments = MW_READ(q, limits.max_discard_segments);
}

static __always_inline struct blk_plug *MW_FN(current_plug)(void)
{
	return MW_FN(mw_current_plug)();
}

/* Does the request at `rq` (a number) still sit in the scheduler, inserted and not issued? */
static __always_inline bool MW_FN(still_queued)(__u64 rq)
{
	struct mw_inflight *slot = inflight_slot_of(rq, 0, MW_SLOT_FIND);

	return slot && slot->insert_ns && !slot->issue_ns;
}

/*
 * block_getrq: the bio needs a request of its own. A missed merge if the kernel could have
 * back-merged it into the newest request of its queue in this task's plug, or into a
 * request in the queue's scheduler, and did not. The request it becomes is recorded as
 * the next candidate either way.
 */
static __always_inline bool MW_FN(missed_merge)(const struct mw_run *run, struct bio *bio, struct request_queue *q,
						__u32 opf, struct mw_getrq_evidence *ev)
{
	__u32 queue_id = (__u32)MW_READ(q, id) + 1;
	struct blk_plug *plug = MW_FN(current_plug)();
	__u64 plug_id = pointer_value(run, plug);
	__u32 index = plug_slot_index(plug_id, queue_id);
	struct mw_merge_limits lim = {};
	struct mw_merge_side b = {};
	struct plug_slot *slot;
	bool cand = false;
	__u32 plug_count = 0, gen_index = plug_gen_index(plug_id);
	struct mw_plug_gen *gen = NULL;
	bool has_elevator = MW_READ(q, elevator) != NULL;
	struct mw_nest *nest = run->nest;

	slot = &nest->plug_slots[index & (MW_PLUG_SLOTS - 1)];
	lim.virt_boundary_mask = MW_READ(q, limits.virt_boundary_mask);
	MW_FN(bio_side)(run, bio, opf, lim.virt_boundary_mask != 0, MW_READ(q, limits.max_segment_size), &b);
	ev->sector = b.sector;
	ev->bytes = (__u64)b.sectors << 9;
	if (plug) {
		plug_count = MW_FN(mw_plug_rq_count)(plug);
		gen = &nest->plug_gens[gen_index & (MW_PLUG_SLOTS - 1)];
		/*
		 * A new (or evicted and re-created) plug state starts above every number this CPU gave
		 * out, so no plug slot recorded before can be in it. That was the clock until the state
		 * thrashed between tasks: a bpf_ktime_get_ns() per new request (BENCHMARKS.md).
		 */
		if (gen && gen->plug != plug_id)
			mw_plug_gen_start(gen, plug_id, nest->plug_seq_high);
		else if (gen)
			mw_plug_gen_observe(gen, plug_count);
	}

	/*
	 * The candidate is judged where it will stay: in the plug slot, which the new request takes
	 * over either way (its own run if no merge was missed, else the candidate's run grown by it).
	 * The plug's candidate is already there; a scheduler's is copied in. No scratch copy each way.
	 */
	if (gen && slot->plug == plug_id && slot->queue_id == queue_id && mw_plug_gen_holds(gen, slot->seq) &&
	    slot->run.sector + slot->run.sectors == b.sector) {
		cand = true;
	} else if (has_elevator) {
		struct sched_key key = { .queue_id = queue_id, .end_sector = b.sector };
		struct sched_entry *queued = bpf_map_lookup_elem(&sched_queued, &key);

		if (queued && MW_FN(still_queued)(queued->rq)) {
			slot->run = queued->run;
			slot->missed = queued->missed;
			cand = true;
		}
	}

	slot->plug = plug_id;
	slot->queue_id = queue_id;
	/* a PREFLUSH/FUA request goes to blk_insert_flush(), not into the plug */
	slot->seq = gen ? mw_plug_gen_add(gen, plug_count, !(b.flags & (MW_F_FUA | MW_F_PREFLUSH))) : 0;
	if (gen && gen->next_seq > nest->plug_seq_high)
		nest->plug_seq_high = gen->next_seq;
	if (cand) {
		MW_FN(queue_limits)(q, &lim);
		if (mw_back_merge_verdict(&slot->run, &b, &lim) == MW_MERGE_OK) {
			ev->missed = 1;
			ev->run_started = !slot->missed;
			ev->run_bytes = (ev->run_started ? (__u64)slot->run.sectors << 9 : 0) + ((__u64)b.sectors << 9);
			mw_merge_side_append(&slot->run, &b);
			slot->missed = 1;
			return true;
		}
	}
	slot->run = b;
	slot->missed = 0;
	return false;
}

/*
 * block_rq_insert into a scheduler: enter the request into sched_queued under its end
 * sector. If it is the request this CPU's last block_getrq built (no plug, or the plug's
 * newest being flushed), its run carries over; else the request alone, its layout in
 * pages unknown.
 */
static __always_inline void MW_FN(enter_scheduler)(const struct mw_run *run, struct request *rq,
						   struct request_queue *q)
{
	__u32 queue_id = (__u32)MW_READ(q, id) + 1, zero = 0;
	/* a flush from a plug runs in the plugging task (current->plug is still set) */
	__u32 index = plug_slot_index(pointer_value(run, MW_FN(current_plug)()), queue_id);
	__u64 start = MW_READ(rq, __sector);
	__u32 sectors = MW_READ(rq, __data_len) >> 9;
	struct sched_key key = { .queue_id = queue_id, .end_sector = start + sectors };
	struct sched_entry *entry = bpf_map_lookup_elem(&sched_scratch, &zero);
	struct plug_slot *slot = &run->nest->plug_slots[index & (MW_PLUG_SLOTS - 1)];
	struct bio *first;
	__u32 opf;

	if (!entry)
		return;
	entry->rq = pointer_value(run, rq);
	if (slot->queue_id == queue_id && slot->run.sector + slot->run.sectors == key.end_sector &&
	    slot->run.sectors >= sectors) {
		entry->run = slot->run;
		entry->missed = slot->missed;
	} else {
		first = MW_READ(rq, bio);
		if (!first)
			return;
		opf = MW_READ(rq, cmd_flags);
		MW_FN(bio_side)(run, first, opf, false, 0, &entry->run); /* segments: nr_phys_segments below */
		entry->run.sector = start;
		entry->run.sectors = sectors;
		entry->run.segments = MW_READ(rq, nr_phys_segments);
		entry->run.flags |= MW_F_OFFSETS_UNKNOWN;
		entry->missed = 0;
	}
	bpf_map_update_elem(&sched_queued, &key, entry, BPF_ANY);
}

static __always_inline int MW_FN(handle_rq_insert)(const struct mw_run *run, struct request *rq,
						 enum mw_slot_access claim)
{
	struct request_queue *q = MW_READ(rq, q);
	struct mw_inflight *slot;
	__u64 now;

	/* Without a scheduler nothing is queued to time: the request clock starts at dispatch. */
	if (request_clock != MW_CLOCK_TABLE && !MW_READ(q, elevator))
		return 0;
	now = bpf_ktime_get_ns();
	slot = inflight_slot(run, rq, now, claim);
	if (!slot) {
		count_event(MW_CNT_INFLIGHT_FULL);
		return 0;
	}
	if (slot->issue_ns && !slot->requeued)
		count_not_seen(slot); /* see handle_rq_issue */
	slot->insert_ns = now;
	slot->issue_ns = 0;
	if (MW_READ(q, elevator))
		MW_FN(enter_scheduler)(run, rq, q);
	return 0;
}

/*
 * The volume a request dispatched to the disk `key` came from, as block_getrq left it (the
 * for_dispatch entry at the request's first sector): its per-volume requests and bytes counted
 * in the pair's slot, the upper device's dev_t returned for the completion (0: none).
 */
static __always_inline __u32 MW_FN(dispatch_volume)(const struct mw_dev_key *key, struct request *rq, __u32 bytes,
						   __u64 now)
{
	struct remap_key at = { .devt = MW_MKDEV(key->major, key->minor), .sector = MW_READ(rq, __sector) };
	struct mw_origin_key pair;
	struct mw_origin_stats *volume;
	struct remap_link *link;
	__u32 origin;

	link = bpf_map_lookup_elem(&remap_origin, &at);
	if (!link || !link->for_dispatch)
		return 0;
	origin = link->origin;
	bpf_map_delete_elem(&remap_origin, &at);
	/* One left by a request this dispatch is not (a front merge moved it on, then it stayed). */
	if (now - link->at_ns > MW_DISPATCH_MAX_AGE_NS)
		return 0;
	pair_key(&pair, key, origin);
	volume = origin_stats_at(&pair, true);
	if (!volume)
		return 0;
	volume->dispatched++;
	volume->dispatched_bytes += bytes;
	return origin;
}

/*
 * The final completion of a request dispatched at `issue_ns`: its device time counted for the device and op
 * `key` names and, with `origin`, for the volume it came from.
 */
static __always_inline void MW_FN(time_request)(const struct mw_dev_key *key, __u32 origin, __u64 issue_ns,
						enum mw_timed_by clock)
{
	__u64 now = bpf_ktime_get_ns();
	/*
	 * Dispatch and completion may read the clock on two CPUs: a completion stamped
	 * before its dispatch is a skew between them, not a lost request; it is timed at 0.
	 */
	__u64 latency = now > issue_ns ? now - issue_ns : 0;
	struct mw_dev_stats *stats = MW_FN(stats_of_key)(key);
	struct mw_origin_stats *volume;
	struct mw_origin_key pair;

	if (stats) {
		hist_add(stats->latency_slots, &stats->latency_sum_ns, latency, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
		if (clock == MW_TIMED_BY_STAMP)
			stats->timed_kernel_stamp++;
		else if (clock == MW_TIMED_BY_DISPATCH)
			stats->timed_dispatch_clock++;
		else
			stats->timed_inflight_table++;
	}
	if (!origin)
		return;
	pair_key(&pair, key, origin);
	volume = origin_stats_at(&pair, false);
	if (volume)
		hist_add(volume->latency_slots, &volume->latency_sum_ns, latency, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
}

#include "request_clock.bpf.h"

/*
 * Dispatch: the request is counted here, except right after a requeue (BLK_STS_RESOURCE
 * after blk_mq_start_request, an NVMe reset or path failover), which block_rq_requeue
 * marks in the request's in-flight slot: diskstats counts the request once. Counting at
 * the final completion, as diskstats does, was tried first: under 100 concurrent scrapers
 * it lost 17-48 of 64000 requests against /sys/block/X/stat (an in-flight slot taken by
 * the wrong request), and again with nest-safe pointers: 63991 of 64000 under 100
 * scrapers. The likely cause: the kernel skips a run of a program that nests on a CPU
 * where it already runs (a completion in an interrupt on top of one in softirq or a
 * kworker: recursion_misses). Dispatch hardly nests that way, and a skipped completion
 * costs a latency sample here, not a request. Flushes and passthrough commands are not I/O: counted apart.
 */
static __always_inline int MW_FN(handle_rq_issue)(const struct mw_run *run, struct request *rq,
						enum mw_slot_access claim)
{
	struct mw_dev_key key = {};
	struct gendisk *disk;
	struct mw_dev_stats *stats;
	struct mw_inflight *slot;
	__u32 op, bytes, requeued, origin = 0;
	__u64 now;

	op = MW_READ(rq, cmd_flags) & MW_REQ_OP_MASK;
	if (op == MW_OP_FLUSH) {
		count_event(MW_CNT_FLUSH);
		return 0;
	}
	if (mw_op_is_passthrough(op)) {
		count_event(MW_CNT_PASSTHROUGH);
		return 0;
	}
	if (request_clock != MW_CLOCK_TABLE) {
		struct request_queue *q = MW_READ(rq, q);

		/* A queue without a scheduler has no queue time to take: no table to read (request_clock.bpf.h). */
		if (!MW_READ(q, elevator))
			return MW_FN(issue_by_clock)(run, rq, q, op);
	}
	inflight_prefetch(pointer_value(run, rq));
	disk = MW_FN(mw_rq_disk)(rq);
	stats = MW_FN(stats_for_key)(disk, op, &key);
	bytes = MW_READ(rq, __data_len);
	now = bpf_ktime_get_ns();
	slot = inflight_slot(run, rq, now, claim);
	if (!slot)
		count_event(MW_CNT_INFLIGHT_FULL); /* counted, untimed */
	requeued = slot && slot->requeued;
	if (stats && !requeued) {
		hist_add(stats->size_slots, &stats->size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS);
		if (remaps_seen)
			origin = MW_FN(dispatch_volume)(&key, rq, bytes, now);
	}
	if (!slot) {
		if (stats)
			stats->latency_lost_inflight_full++;
		return 0;
	}
	/*
	 * Still held from a dispatch that neither completed nor was requeued: that dispatch's
	 * completion never reached handle_rq_complete, and its latency sample is lost. Seen on
	 * 6.18: the request completed (diskstats counted it, a tracefs instance saw the event),
	 * yet no BPF program on block_rq_complete ran for it: two daemons (tp_btf and raw_tp)
	 * lost the same request on the same device. Not the kernel's recursion guard
	 * (__bpf_trace_run() skipping a program already active on the CPU, counted in
	 * bpf_prog_info.recursion_misses since commit 9ed9e9ba2337, "bpf: Count the number of
	 * times recursion was prevented"): recursion_misses stayed 0 for every program; nor an
	 * early return here (debug counters: no partial-completion return, no missing slot).
	 * Measured by attaching another program to a tracepoint and detaching it, over and
	 * over: on block_rq_complete itself (its probe array and static call updated) 0 lost in
	 * 2.3 M with 25,884 cycles; on block_plug, unused otherwise, so its static key and the
	 * kernel text at its call sites flip each time, 0-128 lost in 0.7-2.8 M with 530-942
	 * cycles. The kernel mechanism is not identified. Counted here, when the request pointer
	 * (blk-mq reuses its preallocated requests) is dispatched again, for the device and op
	 * of the lost dispatch.
	 */
	if (slot->issue_ns && !requeued)
		count_not_seen(slot);
	slot->requeued = 0;
	if (slot->insert_ns && !slot->issue_ns) {
		/* leaving the scheduler: no bio can merge into it now */
		struct sched_key key = { .queue_id = (__u32)MW_READ(rq, q, id) + 1 };

		key.end_sector = MW_READ(rq, __sector) + (bytes >> 9);
		bpf_map_delete_elem(&sched_queued, &key);
		if (stats) /* 0 when the two CPUs' clocks disagree (see handle_rq_complete) */
			hist_add(stats->queue_latency_slots, &stats->queue_latency_sum_ns,
				 now > slot->insert_ns ? now - slot->insert_ns : 0, MW_LAT_MIN_SHIFT, MW_LAT_SLOTS);
	}
	if (!requeued) /* a requeued request keeps the volume its first dispatch found */
		slot->origin = origin;
	slot->devt = MW_MKDEV(key.major, key.minor);
	slot->op = disk ? key.op : MW_SLOT_NO_DISK;
	slot->diskseq = key.diskseq;
	slot->issue_ns = now;
	return 0;
}

/* Sent back to be dispatched again: its next dispatch is not a new request. */
static __always_inline int MW_FN(handle_rq_requeue)(const struct mw_run *run, struct request *rq)
{
	struct mw_inflight *slot;

	if (request_clock != MW_CLOCK_TABLE && !MW_READ(rq, q, elevator))
		return MW_FN(requeue_by_clock)(run, rq);
	slot = inflight_slot(run, rq, 0, MW_SLOT_FIND);

	if (slot)
		slot->requeued = 1;
	return 0;
}

/*
 * The final completion: device time from the last dispatch, counted for the device and op the
 * dispatch decided and kept in the slot (the request is not read again for them).
 */
static __always_inline int MW_FN(handle_rq_complete)(const struct mw_run *run, struct request *rq, __u32 nr_bytes)
{
	struct mw_dev_key key = {};
	struct mw_inflight *slot;
	__u64 issue_ns = 0;
	__u32 op, origin = 0;

	/*
	 * No inflight_prefetch() here: the first thing the completion needs is the slot (its key), and
	 * the clock read cannot overlap the slot's transfer (the kernel's TSC read is ordered by LFENCE,
	 * which waits for it). Tried: the clock first, after a prefetch: no better, in one batch worse.
	 * A queue's scheduler cannot change while it has requests: elevator_switch() freezes the queue.
	 */
	if (request_clock != MW_CLOCK_TABLE && !MW_READ(rq, q, elevator))
		return MW_FN(complete_by_clock)(run, rq, nr_bytes);
	slot = inflight_slot(run, rq, 0, MW_SLOT_FIND);
	if (slot) {
		/* Partial completions fire too (nr_bytes < remaining bytes): wait for the last one. */
		if (nr_bytes < MW_READ(rq, __data_len))
			return 0;
		issue_ns = slot->issue_ns;
		dev_key_of(&key, slot->devt, slot->op, slot->diskseq);
		origin = slot->origin;
		slot->rq = 0;
	}
	if (!issue_ns) {
		/*
		 * A data completion whose dispatch was not seen: in flight at attach, after
		 * inflight_map_full, or inserted and its dispatch missed (test_requests once saw
		 * 64 and once 128 of 8192 untimed under raw_tp and mq-deadline with no counter
		 * moving: that was the silent way out). Not lost: flushes and passthrough, which
		 * are not tracked, and nr_bytes 0, the flush machinery ending a PREFLUSH/FUA write
		 * whose data completion was seen or a PREFLUSH without data it never dispatched
		 * (blk_flush_complete_seq() -> blk_mq_end_request() on a request with no bytes
		 * left; measured with bpftrace on an O_DSYNC run: 8159 of 8192 writes).
		 */
		op = MW_READ(rq, cmd_flags) & MW_REQ_OP_MASK;
		if (op != MW_OP_FLUSH && !mw_op_is_passthrough(op) && nr_bytes != 0)
			count_event(MW_CNT_COMPLETE_UNMATCHED);
		return 0;
	}
	if (key.op == MW_SLOT_NO_DISK) {
		count_event(MW_CNT_NO_DISK);
		return 0;
	}
	MW_FN(time_request)(&key, origin, issue_ns, MW_TIMED_BY_TABLE);
	return 0;
}

static __always_inline struct mw_origin_stats *MW_FN(origin_stats_of)(const struct mw_dev_key *disk_key,
									  __u64 sector, bool for_dispatch,
									  struct mw_origin_key *pair,
									  struct remap_link *chain);

static __always_inline int MW_FN(handle_bio_merge)(struct bio *bio, bool back)
{
	struct gendisk *disk = MW_FN(mw_bio_disk)(bio);
	struct mw_origin_stats *origin;
	struct mw_origin_key pair; /* origin_stats_of() fills every field */
	struct remap_link chain;
	struct mw_dev_stats *stats;
	struct mw_dev_key key = {};
	__u32 opf = MW_READ(bio, bi_opf);

	stats = MW_FN(stats_for_key)(disk, opf, &key);
	if (!stats)
		return 0;
	if (back)
		stats->back_merges++;
	else
		stats->front_merges++;
	/* A remapped bio that merged: merging works for its upper device (per-pair merge share). */
	if (remaps_seen) {
		origin = MW_FN(origin_stats_of)(&key, MW_READ(bio, bi_iter.bi_sector), !back, &pair, &chain);
		if (origin)
			origin->merges++;
	}
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
	/* An empty flush (a PREFLUSH write without data) is no bio size: it would pull the mean to 0. */
	if (bytes == 0)
		return 0;
	hist_add(stats->bio_size_slots, &stats->bio_size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT,
		 MW_SIZE_SLOTS);
	return 0;
}

/*
 * Who submitted the top bio of a chain that starts here (docs/design/attribution.md): the
 * submitting task's cgroup, which at the chain's first hop is the caller of submit_bio() for
 * reads and direct I/O, dm-crypt reads included. In the root cgroup (kernel threads: the
 * flusher, kcryptd, md's threads) the bio's blkcg association where the io controller is on
 * the default hierarchy (cgroup writeback, dm-crypt write clones), else a kernel thread's write
 * is "writeback" and its read "kernel" (id 0). A process in the root cgroup is the root, "/".
 */
static __always_inline void MW_FN(chain_cgroup)(struct bio *bio, struct remap_link *link)
{
	struct bio___with_blkg *grouped = (void *)bio;
	struct blkcg_gq *blkg;
	__u64 id = bpf_get_current_cgroup_id();

	link->cgroup = id;
	link->cgroup_source = MW_CG_TASK;
	if (id != cgroup_root_id)
		return;
	if (blkcg_on_cgroup2 && bpf_core_field_exists(grouped->bi_blkg)) {
		blkg = MW_READ(grouped, bi_blkg);
		id = blkg ? MW_READ(blkg, blkcg, css.cgroup, kn, id) : 0;
		if (id && id != cgroup_root_id) {
			link->cgroup = id;
			link->cgroup_source = MW_CG_BLKCG;
			return;
		}
	}
	if (!MW_FN(mw_current_is_kthread)())
		return;
	if (MW_READ(bio, bi_opf) & 1) /* op_is_write() */
		link->cgroup_source = MW_CG_WRITEBACK;
	else
		link->cgroup = 0;
}

/*
 * A stacking driver (dm, md, NVMe multipath) sent the bio on from `from_devt`. Every hop
 * is keyed by the whole disk the bio now addresses (what block_getrq sees), at the
 * sector it now has. A partition remap (blk_partition_remap(): the bio moves from
 * partition-relative to disk sectors on the same disk) starts no chain of its own, but
 * passes an existing one on, since a dm target may sit on a partition: the hop before it
 * was keyed by the same whole disk at the partition-relative sector.
 *
 * Before v5.12 the partition was bio->bi_partno, and blk_partition_remap() traced the
 * remap while bi_partno was still set, clearing it after: keying by first_minor +
 * bi_partno put the chain under the partition, where block_getrq (bi_partno 0 by then)
 * never found it. v5.12 keeps the partition in bio->bi_bdev (commit 309dca309fc3,
 * "block: store a block_device pointer in struct bio"); the whole disk is right for both.
 * Telling the partition hop from a stacking hop needs the partition's own dev_t, which
 * mw_bio_partition_devt() reads from the disk's partition table before v5.11 (an NVMe
 * partition's number is not first_minor + bi_partno: core_fixes.bpf.h).
 */
static __always_inline int MW_FN(handle_bio_remap)(struct bio *bio, __u32 from_devt, __u64 from_sector)
{
	struct remap_key from = { .devt = from_devt, .sector = from_sector }, to = {};
	struct remap_link *chained, link = {};
	bool partition_hop;
	__u64 now;

	to.devt = MW_FN(mw_bio_disk_devt)(bio);
	to.sector = MW_READ(bio, bi_iter.bi_sector);
	partition_hop = MW_FN(mw_bio_partition_devt)(bio) == from_devt && from_devt != to.devt;
	if (partition_hop)
		from.devt = to.devt;
	chained = bpf_map_lookup_elem(&remap_origin, &from);
	/* No chain and no hop of its own (a partition's remap of plain I/O, every bio there): no clock read. */
	if (!chained && (from_devt == to.devt || partition_hop))
		return 0;
	now = bpf_ktime_get_ns();
	if (chained && chained->for_dispatch)
		chained = NULL; /* a request's, not a hop's */
	chained = fresh_remap_link(&from, chained, now);
	if (chained) {
		link.origin = chained->origin;
		link.cgroup = chained->cgroup;
		link.cgroup_source = chained->cgroup_source;
		/* A stacking hop's entry stays for the bio's other clones (fresh_remap_link); a partition's
		 * hop has none, and its partition-relative sector would name another place on the disk. */
		if (partition_hop)
			bpf_map_delete_elem(&remap_origin, &from);
	} else if (from_devt != to.devt && !partition_hop) {
		link.origin = from_devt;
		MW_FN(chain_cgroup)(bio, &link);
	} else {
		return 0;
	}
	link.at_ns = now;
	bpf_map_update_elem(&remap_origin, &to, &link, BPF_ANY);
	remaps_seen = 1;
	return 0;
}

/*
 * The evidence slot of the (disk, origin) pair of a bio that came down a remap chain, taking the
 * chain's last hop (a request, or a merge into one, ends the chain); NULL if the bio was not remapped.
 * `disk_key` is the disk's key as the event built it (its major:minor is the dev_t the last hop was
 * keyed by, mw_bio_disk_devt()), `sector` the bio's: nothing of the disk or the bio is read again.
 * `for_dispatch`: the bio starts a request here (block_getrq, or a front merge that moves the
 * request's start to it): the hop's entry is left, marked, for the request's dispatch, which
 * counts the volume's view (handle_rq_issue). `pair` and `chain` receive the pair's key and the hop.
 */
static __always_inline struct mw_origin_stats *MW_FN(origin_stats_of)(const struct mw_dev_key *disk_key,
									  __u64 sector, bool for_dispatch,
									  struct mw_origin_key *pair,
									  struct remap_link *chain)
{
	struct remap_key at = { .devt = MW_MKDEV(disk_key->major, disk_key->minor), .sector = sector };
	struct remap_link *link;
	__u64 now;

	link = bpf_map_lookup_elem(&remap_origin, &at);
	if (!link || link->for_dispatch)
		return NULL;
	now = bpf_ktime_get_ns();
	link = fresh_remap_link(&at, link, now);
	if (!link)
		return NULL;
	*chain = *link;
	if (for_dispatch) {
		link->for_dispatch = 1;
		link->at_ns = now;
	} else {
		bpf_map_delete_elem(&remap_origin, &at);
	}
	pair_key(pair, disk_key, chain->origin);
	return origin_stats_at(pair, true);
}

/*
 * block_getrq: the missed-merge rules, then what they found counted for the disk (a missed merge)
 * and for the chain's origin (a remapped bio). The disk's key is built once, and only when
 * something is counted: a request that is neither reads nothing of the disk but its queue.
 */
static __always_inline int MW_FN(handle_getrq)(const struct mw_run *run, struct bio *bio)
{
	struct gendisk *disk = MW_FN(mw_bio_disk)(bio);
	struct mw_getrq_evidence ev = {};
	struct mw_origin_key pair; /* origin_stats_of() fills every field */
	struct remap_link chain;
	struct mw_origin_stats *origin;
	struct mw_dev_stats *stats;
	struct mw_dev_key key;
	__u32 opf;

	if (!disk)
		return 0;
	opf = MW_READ(bio, bi_opf);
	MW_FN(missed_merge)(run, bio, MW_READ(disk, queue), opf, &ev);
	if (!ev.missed && !remaps_seen)
		return 0;
	MW_FN(disk_key)(disk, opf, &key);
	if (ev.missed) {
		stats = MW_FN(stats_of_key)(&key);
		if (stats) {
			stats->missed_merges++;
			stats->missed_merge_runs += ev.run_started;
			stats->missed_merge_run_bytes += ev.run_bytes;
		}
	}
	/* The new request's first bio came down a remap chain: count it for the chain's origin. */
	if (remaps_seen) {
		origin = MW_FN(origin_stats_of)(&key, ev.sector, true, &pair, &chain);
		if (origin) {
			count_service(&pair, &chain);
			origin->requests++;
			origin->request_bytes += ev.bytes;
			origin->missed_merges += ev.missed;
			origin->missed_merge_runs += ev.run_started;
			origin->missed_merge_run_bytes += ev.run_bytes;
		}
	}
	return 0;
}
