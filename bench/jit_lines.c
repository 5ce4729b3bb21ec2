// SPDX-License-Identifier: Apache-2.0
/*
 * jit_lines PROG_ID OUT: the JIT image of BPF program PROG_ID written to OUT.bin, and on stdout the line
 * "image ADDRESS LENGTH" (where the kernel placed it) followed by one line "JIT_OFFSET XLATED_INSN" per
 * line-info record: the first byte of the machine code each source line became, and the translated
 * instruction `bpftool prog dump xlated id PROG_ID linum` prints that line above. bench/bpf_profile.py
 * maps perf samples (symbol offsets in bpf_prog_<tag>_<name>) to source lines with it. Debian 12's
 * bpftool cannot dump JIT images (built without libbfd), hence this. Exit 0, 1 on any failure, 2 on
 * bad usage.
 */
#include <bpf/bpf.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
	struct bpf_prog_info info = {};
	__u32 info_len = sizeof(info), image_len, records, i;
	struct bpf_line_info *lines = NULL;
	unsigned char *image = NULL;
	__u64 *jit_addresses = NULL, address = 0;
	char path[4096];
	FILE *out;
	int fd;

	if (argc != 3) {
		fprintf(stderr, "usage: jit_lines PROG_ID OUT\n");
		return 2;
	}
	fd = bpf_prog_get_fd_by_id((__u32)strtoul(argv[1], NULL, 10));
	if (fd < 0 || bpf_obj_get_info_by_fd(fd, &info, &info_len)) {
		fprintf(stderr, "jit_lines: program %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	image_len = info.jited_prog_len;
	/* Line info and its JIT addresses come in pairs: one record each per source line. */
	records = info.nr_jited_line_info < info.nr_line_info ? info.nr_jited_line_info : info.nr_line_info;
	image = malloc(image_len ? image_len : 1);
	lines = calloc(records ? records : 1, sizeof(*lines));
	jit_addresses = calloc(records ? records : 1, sizeof(*jit_addresses));
	if (!image || !lines || !jit_addresses) {
		fprintf(stderr, "jit_lines: out of memory\n");
		return 1;
	}
	memset(&info, 0, sizeof(info));
	info.jited_prog_len = image_len;
	info.jited_prog_insns = (__u64)(unsigned long)image;
	info.nr_line_info = records;
	info.line_info_rec_size = sizeof(*lines);
	info.line_info = (__u64)(unsigned long)lines;
	info.nr_jited_line_info = records;
	info.jited_line_info_rec_size = sizeof(*jit_addresses);
	info.jited_line_info = (__u64)(unsigned long)jit_addresses;
	info.nr_jited_ksyms = 1;
	info.jited_ksyms = (__u64)(unsigned long)&address;
	info_len = sizeof(info);
	if (bpf_obj_get_info_by_fd(fd, &info, &info_len)) {
		fprintf(stderr, "jit_lines: program %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	if (!image_len || !address) {
		fprintf(stderr, "jit_lines: program %s has no JIT image visible here (JIT off, or no CAP_SYS_ADMIN)\n",
			argv[1]);
		return 1;
	}
	snprintf(path, sizeof(path), "%s.bin", argv[2]);
	out = fopen(path, "w");
	if (!out || fwrite(image, 1, image_len, out) != image_len || fclose(out)) {
		fprintf(stderr, "jit_lines: %s: %s\n", path, strerror(errno));
		return 1;
	}
	printf("image %llx %u\n", (unsigned long long)address, image_len);
	for (i = 0; i < records; i++)
		printf("%llu %u\n", (unsigned long long)(jit_addresses[i] - address), lines[i].insn_off);
	return 0;
}
