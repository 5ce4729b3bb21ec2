// SPDX-License-Identifier: BSD-2-Clause OR GPL-2.0-only
/*
 * The floor for `make bench`: empty tp_btf programs on every tracepoint mergewatchd can attach.
 * bench/floor.c attaches the subset the daemon attached in the same scenario (bench/run.py reads
 * it from the daemon's links), so the floor's total is comparable with the daemon's. What
 * mergewatchd spends above this per program is the cost of what it records; the floor itself is
 * the cost of being attached plus, under kernel.bpf_stats_enabled, of the accounting.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tp_btf/block_rq_insert") int BPF_PROG(floor_rq_insert) { return 0; }
SEC("tp_btf/block_rq_issue") int BPF_PROG(floor_rq_issue) { return 0; }
SEC("tp_btf/block_rq_requeue") int BPF_PROG(floor_rq_requeue) { return 0; }
SEC("tp_btf/block_rq_complete") int BPF_PROG(floor_rq_complete) { return 0; }
SEC("tp_btf/block_bio_backmerge") int BPF_PROG(floor_bio_backmerge) { return 0; }
SEC("tp_btf/block_bio_frontmerge") int BPF_PROG(floor_bio_frontmerge) { return 0; }
SEC("tp_btf/block_bio_queue") int BPF_PROG(floor_bio_queue) { return 0; }
SEC("tp_btf/block_getrq") int BPF_PROG(floor_getrq) { return 0; }
SEC("tp_btf/block_bio_remap") int BPF_PROG(floor_bio_remap) { return 0; }
