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

/* The kernel's dev_t encoding (MKDEV in include/linux/kdev_t.h), as tracepoints pass it. */
#define MW_MINORBITS 20
#define MW_MKDEV(ma, mi) (((__u32)(ma) << MW_MINORBITS) | (__u32)(mi))

/*
 * The dev_t of the block device (partition or whole disk) a bio is addressed to.
 * Before v5.12 the bio held the disk and a partition number instead of a bdev
 * (commit 309dca309fc3, above); partition minors were first_minor + partno then.
 */
struct bio___with_bi_partno {
	struct gendisk *bi_disk;
	__u8 bi_partno;
} __attribute__((preserve_access_index));

static __always_inline __u32 mw_bio_devt(struct bio *bio)
{
	struct bio___with_bi_partno *old = (void *)bio;

	if (bpf_core_field_exists(old->bi_disk))
		return MW_MKDEV(BPF_CORE_READ(old, bi_disk, major),
				BPF_CORE_READ(old, bi_disk, first_minor) + BPF_CORE_READ(old, bi_partno));
	return BPF_CORE_READ(bio, bi_bdev, bd_dev);
}

/*
 * v5.15 numbers every disk ever created (gendisk->diskseq), so a re-created device that
 * got an old major:minor can be told apart; 0 on older kernels.
 * commit 87eb71078bb5 ("block: add a sequence number to disks")
 */
struct gendisk___with_diskseq {
	__u64 diskseq;
} __attribute__((preserve_access_index));

static __always_inline __u64 mw_disk_seq(struct gendisk *disk)
{
	struct gendisk___with_diskseq *d = (void *)disk;

	if (bpf_core_field_exists(d->diskseq))
		return BPF_CORE_READ(d, diskseq);
	return 0;
}

#endif /* MERGEWATCH_CORE_FIXES_BPF_H */
