// SPDX-License-Identifier: Apache-2.0
/*
 * The `make bench` floor loader: loads bench/floor.bpf.c, attaches the programs of the named
 * tracepoints (all of them when none is named), prints "attached N", then waits for SIGINT or
 * SIGTERM and detaches. Usage: floor OBJECT.bpf.o [TRACEPOINT...]  e.g. floor floor.bpf.o
 * block_rq_issue block_rq_complete. Exit 0 on a clean stop, 1 on any failure, 2 on bad usage.
 */
#include <bpf/libbpf.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define MAX_LINKS 32

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

/* "tp_btf/block_rq_issue" -> "block_rq_issue" */
static const char *tracepoint_of(const struct bpf_program *prog)
{
	const char *sec = bpf_program__section_name(prog), *slash = strchr(sec, '/');

	return slash ? slash + 1 : sec;
}

static int wanted(const char *tp, int argc, char **argv)
{
	int i;

	if (argc <= 2)
		return 1;
	for (i = 2; i < argc; i++)
		if (!strcmp(argv[i], tp))
			return 1;
	return 0;
}

int main(int argc, char **argv)
{
	struct bpf_link *links[MAX_LINKS];
	struct bpf_program *prog;
	struct bpf_object *obj;
	struct sigaction sa;
	int n = 0, i, err, status = 1, selected = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s OBJECT.bpf.o [TRACEPOINT...]\n", argv[0]);
		return 2;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	obj = bpf_object__open_file(argv[1], NULL);
	if (!obj) {
		fprintf(stderr, "floor: cannot open %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	bpf_object__for_each_program(prog, obj) {
		int on = wanted(tracepoint_of(prog), argc, argv);

		bpf_program__set_autoload(prog, on);
		selected += on;
	}
	if (selected != (argc <= 2 ? selected : argc - 2)) {
		fprintf(stderr, "floor: %d of %d named tracepoints have a program in %s\n", selected, argc - 2,
			argv[1]);
		goto out;
	}
	err = bpf_object__load(obj);
	if (err) {
		fprintf(stderr, "floor: cannot load %s: %s\n", argv[1], strerror(-err));
		goto out;
	}
	bpf_object__for_each_program(prog, obj) {
		if (!bpf_program__autoload(prog))
			continue;
		if (n == MAX_LINKS) {
			fprintf(stderr, "floor: more than %d programs\n", MAX_LINKS);
			goto out;
		}
		links[n] = bpf_program__attach(prog);
		if (!links[n]) {
			fprintf(stderr, "floor: cannot attach %s: %s\n", bpf_program__name(prog), strerror(errno));
			goto out;
		}
		n++;
	}
	printf("attached %d\n", n);
	fflush(stdout);
	while (!stop)
		pause();
	status = 0;
out:
	for (i = 0; i < n; i++)
		bpf_link__destroy(links[i]);
	bpf_object__close(obj);
	return status;
}
