// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
// Loads and attaches every program of a BPF object, then waits for SIGINT/SIGTERM: the
// `make bench` floor (bench/floor.bpf.c). Links are destroyed on exit.
#include <bpf/libbpf.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv)
{
	struct bpf_link *links[32];
	struct bpf_program *prog;
	struct bpf_object *obj;
	int n = 0, i;

	if (argc != 2) {
		fprintf(stderr, "usage: %s OBJECT.bpf.o\n", argv[0]);
		return 2;
	}
	obj = bpf_object__open_file(argv[1], NULL);
	if (!obj || bpf_object__load(obj)) {
		fprintf(stderr, "cannot load %s\n", argv[1]);
		return 1;
	}
	bpf_object__for_each_program(prog, obj) {
		if (n == 32 || !(links[n] = bpf_program__attach(prog))) {
			fprintf(stderr, "cannot attach %s\n", bpf_program__name(prog));
			return 1;
		}
		n++;
	}
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);
	printf("attached %d\n", n);
	fflush(stdout);
	while (!stop)
		pause();
	for (i = 0; i < n; i++)
		bpf_link__destroy(links[i]);
	bpf_object__close(obj);
	return 0;
}
