/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * CO-RE shims for kernel struct changes, each chosen at load time from the running
 * kernel's BTF (bpf_core_field_exists), never from a version number.
 */
#ifndef MERGEWATCH_CORE_FIXES_BPF_H
#define MERGEWATCH_CORE_FIXES_BPF_H

#include <bpf/bpf_core_read.h>

/*
 * v5.17 removed request->rq_disk; the disk is reached through the queue since then.
 * commit f3fa33acca9f ("block: remove the ->rq_disk field in struct request")
 */
struct request___with_rq_disk {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline struct gendisk *mw_rq_disk(struct request *rq)
{
	struct request___with_rq_disk *old = (void *)rq;

	if (bpf_core_field_exists(old->rq_disk))
		return BPF_CORE_READ(old, rq_disk);
	return BPF_CORE_READ(rq, q, disk);
}

/*
 * v5.12 moved the disk from bio->bi_disk to bio->bi_bdev->bd_disk.
 * commit 309dca309fc3 ("block: store a block_device pointer in struct bio")
 */
struct bio___with_bi_disk {
	struct gendisk *bi_disk;
} __attribute__((preserve_access_index));

static __always_inline struct gendisk *mw_bio_disk(struct bio *bio)
{
	struct bio___with_bi_disk *old = (void *)bio;

	if (bpf_core_field_exists(old->bi_disk))
		return BPF_CORE_READ(old, bi_disk);
	return BPF_CORE_READ(bio, bi_bdev, bd_disk);
}

#endif /* MERGEWATCH_CORE_FIXES_BPF_H */
