#define _GNU_SOURCE
#include "idlepoll.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct shardd_idlepoll {
	_Atomic int64_t until;     // CLOCK_MONOTONIC ns up to which to spin
	_Atomic uint32_t seq;      // bumped by each extend: the futex word
	_Atomic uint32_t sleeping; // the thread waits (or is about to) on seq
	_Atomic uint32_t stop;
	_Atomic int64_t spun;      // ns of CPU time spent spinning
	_Atomic int32_t tid;       // the thread's id once it runs; -errno: it could not
	pthread_t thread;
};

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield");
#endif
}

// thread_ns is the calling thread's CPU time.
static int64_t thread_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void *run(void *arg) {
	shardd_idlepoll *p = arg;
	// SCHED_IDLE, so the thread never competes with a runnable thread of
	// normal priority on its CPU (glibc's thread attributes take only
	// OTHER, FIFO and RR, hence here).
	struct sched_param sp = {0};
	if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0) {
		atomic_store(&p->tid, -errno);
		return NULL;
	}
	atomic_store(&p->tid, (int32_t)syscall(SYS_gettid));
	int64_t last = -1; // thread CPU time last counted into spun; -1: asleep
	unsigned slices = 0;
	while (!atomic_load(&p->stop)) {
		uint32_t seen = atomic_load(&p->seq);
		if (now_ns() < atomic_load(&p->until)) {
			if (last < 0) {
				last = thread_ns();
			}
			// Spin in slices of a few microseconds, so that an extend or
			// a stop is seen soon; count the CPU time every 256.
			for (int i = 0; i < 64; i++) {
				relax();
			}
			if (++slices % 256 == 0) {
				int64_t t = thread_ns();
				atomic_fetch_add(&p->spun, t - last);
				last = t;
			}
			continue;
		}
		if (last >= 0) {
			atomic_fetch_add(&p->spun, thread_ns() - last);
			last = -1;
		}
		// Past the deadline: sleep until an extend bumps seq. An extend
		// between reading seen and the wait makes the wait return at once;
		// one after it sees sleeping and wakes it.
		atomic_store(&p->sleeping, 1);
		if (atomic_load(&p->seq) == seen && !atomic_load(&p->stop)) {
			syscall(SYS_futex, &p->seq, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
		}
		atomic_store(&p->sleeping, 0);
	}
	if (last >= 0) {
		atomic_fetch_add(&p->spun, thread_ns() - last);
	}
	return NULL;
}

shardd_idlepoll *shardd_idlepoll_start(int cpu, int *err) {
	if (cpu < 0 || cpu >= CPU_SETSIZE) {
		*err = EINVAL;
		return NULL;
	}
	shardd_idlepoll *p = calloc(1, sizeof *p);
	if (p == NULL) {
		*err = ENOMEM;
		return NULL;
	}
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	// The thread starts pinned; it puts itself at SCHED_IDLE and says
	// whether it could before this returns.
	int e = pthread_attr_setaffinity_np(&attr, sizeof set, &set);
	if (e == 0) {
		// The thread starts with every signal blocked: they go to the Go
		// runtime's threads, never to this one.
		sigset_t all, was;
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &was);
		e = pthread_create(&p->thread, &attr, run, p);
		pthread_sigmask(SIG_SETMASK, &was, NULL);
	}
	pthread_attr_destroy(&attr);
	if (e != 0) {
		free(p);
		*err = e;
		return NULL;
	}
	int32_t tid;
	while ((tid = atomic_load(&p->tid)) == 0) {
		sched_yield();
	}
	if (tid < 0) {
		pthread_join(p->thread, NULL);
		free(p);
		*err = -tid;
		return NULL;
	}
	return p;
}

static void wake(shardd_idlepoll *p) {
	atomic_fetch_add(&p->seq, 1);
	if (atomic_load(&p->sleeping)) {
		syscall(SYS_futex, &p->seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	}
}

void shardd_idlepoll_extend(shardd_idlepoll *p, int64_t window_ns) {
	atomic_store(&p->until, now_ns() + window_ns);
	wake(p);
}

int64_t shardd_idlepoll_spun(shardd_idlepoll *p) { return atomic_load(&p->spun); }

int32_t shardd_idlepoll_tid(shardd_idlepoll *p) { return atomic_load(&p->tid); }

void shardd_idlepoll_stop(shardd_idlepoll *p) {
	atomic_store(&p->stop, 1);
	wake(p);
	pthread_join(p->thread, NULL);
	free(p);
}
