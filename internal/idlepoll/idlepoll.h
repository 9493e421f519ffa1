// The idle poller's C side: a thread pinned to one CPU at SCHED_IDLE that
// spins while a deadline lies ahead and sleeps on a futex otherwise.
#ifndef SHARDD_IDLEPOLL_H
#define SHARDD_IDLEPOLL_H

#include <stdint.h>

typedef struct shardd_idlepoll shardd_idlepoll;

// shardd_idlepoll_start starts a poller on cpu; NULL with *err set to an
// errno value where the thread cannot be pinned there, be put at
// SCHED_IDLE, or be created.
shardd_idlepoll *shardd_idlepoll_start(int cpu, int *err);
// shardd_idlepoll_extend makes the poller spin for window_ns from now.
void shardd_idlepoll_extend(shardd_idlepoll *p, int64_t window_ns);
// shardd_idlepoll_spun is the CPU time the poller has spun, in ns.
int64_t shardd_idlepoll_spun(shardd_idlepoll *p);
// shardd_idlepoll_tid is the thread's id.
int32_t shardd_idlepoll_tid(shardd_idlepoll *p);
// shardd_idlepoll_stop ends the thread and frees the poller.
void shardd_idlepoll_stop(shardd_idlepoll *p);

#endif
