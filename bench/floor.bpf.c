// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The floor for `make bench`: empty programs on the tracepoints mergewatchd keeps attached
 * without a stacked dm/md device (block_bio_queue is attached only with one). What remains of
 * mergewatchd's BPF time above this is the cost of what it records.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tp_btf/block_rq_insert") int BPF_PROG(floor_rq_insert) { return 0; }
SEC("tp_btf/block_rq_issue") int BPF_PROG(floor_rq_issue) { return 0; }
SEC("tp_btf/block_rq_complete") int BPF_PROG(floor_rq_complete) { return 0; }
SEC("tp_btf/block_bio_backmerge") int BPF_PROG(floor_bio_backmerge) { return 0; }
SEC("tp_btf/block_bio_frontmerge") int BPF_PROG(floor_bio_frontmerge) { return 0; }
SEC("tp_btf/block_getrq") int BPF_PROG(floor_getrq) { return 0; }
SEC("tp_btf/block_bio_remap") int BPF_PROG(floor_bio_remap) { return 0; }
