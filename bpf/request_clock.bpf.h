/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * The request clock of queues without an I/O scheduler: how a request's device time is taken
 * without a table the dispatch must read (docs/design/request-clock.md says why and what it costs).
 *
 * - kernel stamp: blk_mq_start_request() stamps rq->io_start_time_ns right after block_rq_issue when
 *   the queue has QUEUE_FLAG_STATS (wbt, iolatency, iocost keep it set). Where that stamp will be
 *   within MW_STAMP_BOUND_NS of the dispatch (a fresh clock read, or since v6.9 a plug's cached clock
 *   that is young enough) the dispatch stores nothing; the completion reads the stamp.
 * - dispatch clock: otherwise the dispatch stores its own clock into the request's slot of
 *   dispatch_clock without reading it; the completion takes the record only if it is this dispatch's.
 *
 * Included by handlers.bpf.h once per program flavor (MW_FN, MW_READ). No include guard.
 */

/*
 * mw_dispatch_clock.kernel_stamp of a dispatch after which the kernel reads its clock afresh (a request from a
 * volume on a stamped queue keeps its record for the volume): the stamp is not known here, not checked.
 */
#define MW_STAMP_FRESH (~0ull)

/* The queue will have the kernel stamp this dispatch: QUEUE_FLAG_STATS in q->queue_flags. */
static __always_inline bool MW_FN(queue_stamps)(struct request_queue *q)
{
	return (MW_READ(q, queue_flags) >> queue_flag_stats_bit) & 1;
}

/* The request carries the kernel's stamp of a dispatch of this allocation: RQF_STATS in rq->rq_flags. */
static __always_inline bool MW_FN(request_stamped)(struct request *rq)
{
	return ((__u64)MW_READ(rq, rq_flags) >> rqf_stats_bit) & 1;
}

/*
 * A dispatch of `rq` after a requeue of it on a clock queue (block_rq_requeue left it in
 * requeued_requests): not a new request. The entry is taken either way; one of an earlier allocation
 * of the pointer (start_ns differs) or older than MW_INFLIGHT_STALE_NS is a leftover, not this one.
 */
static __always_inline bool MW_FN(take_requeue)(struct request *rq, __u64 rq_id)
{
	struct mw_requeued *entry = bpf_map_lookup_elem(&requeued_requests, &rq_id);
	bool requeued;

	if (!entry)
		return false;
	requeued = entry->start_ns == MW_READ(rq, start_time_ns) &&
		   bpf_ktime_get_ns() - entry->at_ns <= MW_INFLIGHT_STALE_NS;
	if (bpf_map_delete_elem(&requeued_requests, &rq_id) == 0)
		__sync_fetch_and_add(&requeues_pending, -1);
	return requeued;
}

static __always_inline int MW_FN(requeue_by_clock)(const struct mw_run *run, struct request *rq)
{
	struct mw_requeued entry;
	__u64 rq_id;

	/*
	 * Only a request that was dispatched (rq->state not MQ_RQ_IDLE, 0, as __blk_mq_requeue_request() reads
	 * it after this tracepoint): a driver's BUSY before blk_mq_start_request() requeues one never counted.
	 */
	if (MW_READ(rq, state) == 0)
		return 0;
	entry.start_ns = MW_READ(rq, start_time_ns);
	entry.at_ns = bpf_ktime_get_ns();
	rq_id = pointer_value(run, rq);
	if (bpf_map_update_elem(&requeued_requests, &rq_id, &entry, BPF_NOEXIST) == 0)
		__sync_fetch_and_add(&requeues_pending, 1);
	return 0;
}

/*
 * Dispatch on a queue without a scheduler: counted as handle_rq_issue says, then timed by the kernel's
 * stamp if it will be exact, else by a blind store into the request's dispatch clock slot.
 */
static __always_inline int MW_FN(issue_by_clock)(const struct mw_run *run, struct request *rq,
					       struct request_queue *q, __u32 op)
{
	struct mw_dev_key key = {};
	struct gendisk *disk = MW_FN(mw_rq_disk)(rq);
	struct mw_dev_stats *stats = MW_FN(stats_for_key)(disk, op, &key);
	__u64 rq_id = pointer_value(run, rq), now = 0, expected, cached;
	__u32 bytes = MW_READ(rq, __data_len), origin = 0, way;
	struct mw_dispatch_clock *slot;
	bool requeued = false;

	if (!disk)
		return 0; /* counted as request_without_disk; its completion finds no record */
	if (!first_clock_dispatch_ns)
		first_clock_dispatch_ns = bpf_ktime_get_ns();
	if (requeues_pending)
		requeued = MW_FN(take_requeue)(rq, rq_id);
	if (stats && !requeued) {
		hist_add(stats->size_slots, &stats->size_sum_bytes, bytes, MW_SIZE_MIN_SHIFT, MW_SIZE_SLOTS);
		if (remaps_seen) {
			now = bpf_ktime_get_ns();
			origin = MW_FN(dispatch_volume)(&key, rq, bytes, now);
		}
	}
	/*
	 * The kernel's stamp: after this tracepoint, blk_time_get_ns(), which since v6.9 is the plug's
	 * cached clock when the task has a plug holding one (else a fresh read, cached for the plug's next
	 * use). A request with a volume keeps the table: its completion needs the volume.
	 */
	if (request_clock == MW_CLOCK_STAMPS && MW_FN(queue_stamps)(q)) {
		cached = MW_FN(mw_plug_cached_ns)();
		if (!cached && !origin)
			return 0;
		expected = MW_STAMP_FRESH;
		if (cached) {
			if (!now)
				now = bpf_ktime_get_ns();
			if (now - cached <= MW_STAMP_BOUND_NS && !origin)
				return 0;
			expected = cached;
		}
	} else {
		expected = MW_READ(rq, io_start_time_ns); /* no stamp coming: what stays there */
	}
	if (!now)
		now = bpf_ktime_get_ns();
	way = inflight_way0(rq_id);
	slot = bpf_map_lookup_elem(&dispatch_clock, &way);
	if (!slot)
		return 0;
	slot->rq = rq_id;
	slot->issue_ns = now;
	slot->kernel_stamp = expected;
	slot->start_ns = MW_READ(rq, start_time_ns);
	slot->devt = MW_MKDEV(key.major, key.minor);
	slot->op = key.op;
	slot->origin = origin;
	slot->diskseq = key.diskseq;
	return 0;
}

/*
 * The final completion on a queue without a scheduler: this dispatch's record in the dispatch clock
 * table if it holds one, else the kernel's stamp. The table is read, never written.
 */
static __always_inline int MW_FN(complete_by_clock)(const struct mw_run *run, struct request *rq, __u32 nr_bytes)
{
	struct mw_dev_key key = {};
	struct mw_dispatch_clock *slot;
	__u64 rq_id, stamp, issue_ns = 0;
	__u32 op = MW_READ(rq, cmd_flags) & MW_REQ_OP_MASK, origin = 0, way;
	bool stamped, by_stamp = false;

	/*
	 * nr_bytes 0: the flush machinery ending a PREFLUSH/FUA write whose data completion was timed already
	 * (the record is not consumed, so it would be timed twice: 400 samples for 200 O_DSYNC writes).
	 */
	if (op == MW_OP_FLUSH || mw_op_is_passthrough(op) || nr_bytes == 0)
		return 0;
	/* Partial completions fire too (nr_bytes < remaining bytes): wait for the last one. */
	if (nr_bytes < MW_READ(rq, __data_len))
		return 0;
	stamp = MW_READ(rq, io_start_time_ns);
	stamped = request_clock == MW_CLOCK_STAMPS && MW_FN(request_stamped)(rq);
	/*
	 * Before v6.9 a stamped request has a record only if it came from a volume (remaps_seen): else its
	 * dispatch stored nothing and the table is not read.
	 */
	if (!stamped || remaps_seen || bpf_core_field_exists(struct blk_plug___with_ktime, cur_ktime)) {
		rq_id = pointer_value(run, rq);
		way = inflight_way0(rq_id);
		slot = bpf_map_lookup_elem(&dispatch_clock, &way);
		/* With the kernel's stamps unused, the kernel may still stamp after the dispatch's record. */
		if (slot && slot->rq == rq_id &&
		    (request_clock != MW_CLOCK_STAMPS || slot->kernel_stamp == stamp || slot->kernel_stamp == MW_STAMP_FRESH) &&
		    slot->start_ns == MW_READ(rq, start_time_ns)) {
			issue_ns = slot->issue_ns;
			dev_key_of(&key, slot->devt, slot->op, slot->diskseq);
			origin = slot->origin;
		}
	}
	/* A stamp from before the first dispatch seen: in flight when the programs were attached, never counted. */
	if (!issue_ns && stamped && stamp && first_clock_dispatch_ns && stamp >= first_clock_dispatch_ns) {
		struct gendisk *disk = MW_FN(mw_rq_disk)(rq);

		if (!disk)
			return 0;
		MW_FN(disk_key)(disk, op, &key);
		issue_ns = stamp;
		by_stamp = true;
	}
	if (!issue_ns) {
		/* Dispatched before the programs were attached, or its slot taken by another request and no stamp. */
		count_event(MW_CNT_COMPLETE_UNMATCHED);
		return 0;
	}
	MW_FN(time_request)(&key, origin, issue_ns, by_stamp ? MW_TIMED_BY_STAMP : MW_TIMED_BY_DISPATCH);
	return 0;
}
