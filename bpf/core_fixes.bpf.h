/* SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only */
/*
 * CO-RE shims for kernel struct changes, each chosen at load time from the running
 * kernel's BTF (bpf_core_field_exists), never from a version number.
 *
 * Included by handlers.bpf.h once per program flavor: the types once, the functions per
 * flavor (MW_FN names them, MW_READ reads).
 */
#ifndef MERGEWATCH_CORE_FIXES_TYPES
#define MERGEWATCH_CORE_FIXES_TYPES

#include <bpf/bpf_core_read.h>

/*
 * v5.17 removed request->rq_disk; the disk is reached through the queue since then.
 * commit f3fa33acca9f ("block: remove the ->rq_disk field in struct request")
 */
struct request___with_rq_disk {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

/*
 * v5.12 moved the disk from bio->bi_disk to bio->bi_bdev->bd_disk, and the partition
 * number bi_partno went with it (partition minors were first_minor + partno then).
 * commit 309dca309fc3 ("block: store a block_device pointer in struct bio")
 */
struct bio___with_bi_disk {
	struct gendisk *bi_disk;
	__u8 bi_partno;
} __attribute__((preserve_access_index));

/*
 * Before v5.11 a partition was a struct hd_struct in the disk's part_tbl, indexed by bi_partno, its dev_t
 * in __dev.devt (part_devt()); v5.11 merged it into struct block_device, commit 0d02129e76ed ("block:
 * merge struct block_device and struct hd_struct"). Read where first_minor + bi_partno is not the
 * partition's number: extended dev_t disks (NVMe, GENHD_FL_EXT_DEVT) number their partitions from the
 * shared major 259 pool, so nvme1n1p1 is 259:3 beside nvme1n1 at 259:1.
 */
struct hd_struct___old {
	struct device __dev;
} __attribute__((preserve_access_index));

struct disk_part_tbl___old {
	struct hd_struct___old *part[0];
} __attribute__((preserve_access_index));

struct gendisk___with_part_tbl {
	struct disk_part_tbl___old *part_tbl;
} __attribute__((preserve_access_index));

/*
 * v5.15 numbers every disk ever created (gendisk->diskseq), so a re-created device that
 * got an old major:minor can be told apart; 0 on older kernels.
 * commit 87eb71078bb5 ("block: add a sequence number to disks")
 */
struct gendisk___with_diskseq {
	__u64 diskseq;
} __attribute__((preserve_access_index));

/* Fields that exist only with a kernel config or version; read only if the BTF has them. */
struct bio___with_crypt { /* CONFIG_BLK_INLINE_ENCRYPTION, v5.8 */
	void *bi_crypt_context;
} __attribute__((preserve_access_index));

/*
 * Removed in v5.18 and back in v6.9: commit 449813515d3e ("block, fs: Restore the
 * per-bio/request data lifetime fields").
 */
struct bio___with_write_hint {
	__u8 bi_write_hint; /* an enum of 1 byte today, of 4 or 2 bytes before: read by its real size */
} __attribute__((preserve_access_index));

struct bio___with_blkg { /* CONFIG_BLK_CGROUP */
	struct blkcg_gq *bi_blkg;
} __attribute__((preserve_access_index));

/*
 * v6.9 caches the block layer's clock in the plug: blk_time_get_ns() returns plug->cur_ktime, set at
 * its first use in the plug and cleared when the plug flushes or the task schedules, so
 * rq->io_start_time_ns may be older than the dispatch. commit da4c8c3d0975 ("block: cache current
 * nsec time in struct blk_plug"); docs/design/request-clock.md.
 */
struct blk_plug___with_ktime {
	__u64 cur_ktime;
} __attribute__((preserve_access_index));

#endif /* MERGEWATCH_CORE_FIXES_TYPES */

static __always_inline struct gendisk *MW_FN(mw_rq_disk)(struct request *rq)
{
	struct request___with_rq_disk *old = (void *)rq;

	if (bpf_core_field_exists(old->rq_disk))
		return MW_READ(old, rq_disk);
	return MW_READ(rq, q, disk);
}

static __always_inline struct gendisk *MW_FN(mw_bio_disk)(struct bio *bio)
{
	struct bio___with_bi_disk *old = (void *)bio;

	if (bpf_core_field_exists(old->bi_disk))
		return MW_READ(old, bi_disk);
	return MW_READ(bio, bi_bdev, bd_disk);
}

/* The dev_t of the whole disk a bio is addressed to (never a partition). */
static __always_inline __u32 MW_FN(mw_bio_disk_devt)(struct bio *bio)
{
	struct gendisk *disk = MW_FN(mw_bio_disk)(bio);

	return MW_MKDEV(MW_READ(disk, major), MW_READ(disk, first_minor));
}

/*
 * The dev_t of the partition (or whole disk) a bio is addressed to. Since v5.12 the bio's
 * bi_bdev (commit 309dca309fc3). Before, the disk's partition table entry bi_partno
 * (hd_struct, before v5.11; see above): first_minor + bi_partno is that number only for a disk
 * with its own minors. For an NVMe partition on Debian 11's 5.10 it named another disk, so
 * blk_partition_remap()'s block_bio_remap (traced while bi_partno is still set) was not seen
 * as the partition's hop: the partition became the chain's origin and the dm device above it
 * was lost (the 8 KiB-chunk snapshot on nvme1n1p1 did not page, collapse {"": 0}, whenever the
 * partition's number was not the disk's next minor: that depends on the order the disks probed).
 * On v5.11 (bi_disk without hd_struct) first_minor + bi_partno stays: a miss there only loses
 * the origin of a partition's chain.
 */
static __always_inline __u32 MW_FN(mw_bio_partition_devt)(struct bio *bio)
{
	struct bio___with_bi_disk *old = (void *)bio;
	struct gendisk___with_part_tbl *disk;
	struct disk_part_tbl___old *tbl;
	struct hd_struct___old *part = NULL;
	__u32 partno;

	if (!bpf_core_field_exists(old->bi_disk))
		return MW_READ(bio, bi_bdev, bd_dev);
	partno = MW_READ(old, bi_partno);
	if (partno != 0 && bpf_core_type_exists(struct hd_struct___old)) {
		disk = (void *)MW_READ(old, bi_disk);
		tbl = BPF_CORE_READ(disk, part_tbl);
		/* part[partno], a flexible array: its offset relocated, the index added by hand. */
		if (tbl && bpf_probe_read_kernel(&part, sizeof(part), (void *)tbl + bpf_core_field_offset(tbl->part) +
									     partno * sizeof(part)) == 0 && part)
			return BPF_CORE_READ(part, __dev.devt);
		return 0;
	}
	return MW_MKDEV(MW_READ(old, bi_disk, major), MW_READ(old, bi_disk, first_minor) + partno);
}

static __always_inline __u64 MW_FN(mw_disk_seq)(struct gendisk *disk)
{
	struct gendisk___with_diskseq *d = (void *)disk;

	if (bpf_core_field_exists(d->diskseq))
		return MW_READ(d, diskseq);
	return 0;
}

/*
 * current->plug. The typed task pointer of bpf_get_current_task_btf() arrived in v5.11:
 * commit 3ca1032ab7ab ("bpf: Implement get_current_task_btf and RET_PTR_TO_BTF_ID"); 5.10
 * refuses the call ("invalid func unknown#158"). There, and in the raw_tp flavor, the task is
 * a plain number from bpf_get_current_task() and its field is read with bpf_probe_read_kernel.
 * The test is a CO-RE enum relocation against the kernel's BTF (or --path.btf): libbpf
 * writes a constant, the verifier drops the path not taken and never sees the unknown call.
 * Cost where the helper exists: btf_getrq 1054 -> 1064 xlated instructions on 6.18 (the other
 * programs lost 4-10 each with the per-layout variants; docs/kernels.md, "The matrix").
 */
static __always_inline struct blk_plug *MW_FN(mw_current_plug)(void)
{
	struct task_struct *task;

#ifdef MW_TYPED_ARGS
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf)) {
		task = bpf_get_current_task_btf();
		return task ? task->plug : NULL;
	}
#endif
	task = (struct task_struct *)bpf_get_current_task();
	return task ? BPF_CORE_READ(task, plug) : NULL;
}

/*
 * Whether current is a kernel thread (PF_KTHREAD, include/linux/sched.h, the same bit on every
 * supported kernel). The task as mw_current_plug() takes it: typed where the kernel has
 * bpf_get_current_task_btf(), else read through bpf_probe_read_kernel.
 */
static __always_inline bool MW_FN(mw_current_is_kthread)(void)
{
	struct task_struct *task;

#ifdef MW_TYPED_ARGS
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf)) {
		task = bpf_get_current_task_btf();
		return task && (task->flags & 0x00200000 /* PF_KTHREAD */);
	}
#endif
	task = (struct task_struct *)bpf_get_current_task();
	return task && (BPF_CORE_READ(task, flags) & 0x00200000 /* PF_KTHREAD */);
}

/* plug->rq_count of the plug above: a typed pointer only where the task was one. */
static __always_inline __u32 MW_FN(mw_plug_rq_count)(struct blk_plug *plug)
{
#ifdef MW_TYPED_ARGS
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf))
		return plug->rq_count;
#endif
	return BPF_CORE_READ(plug, rq_count);
}

/*
 * plug->cur_ktime of the current task's plug: 0 when the task has no plug, the plug holds no cached
 * time, or the kernel caches none (before v6.9).
 */
static __always_inline __u64 MW_FN(mw_plug_cached_ns)(void)
{
	struct blk_plug___with_ktime *plug;

	if (!bpf_core_field_exists(struct blk_plug___with_ktime, cur_ktime))
		return 0;
	plug = (void *)MW_FN(mw_current_plug)();
	if (!plug)
		return 0;
#ifdef MW_TYPED_ARGS
	if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_get_current_task_btf))
		return plug->cur_ktime;
#endif
	return BPF_CORE_READ(plug, cur_ktime);
}
