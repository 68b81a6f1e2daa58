#include <dlfcn.h>
#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <rte_eal_memconfig.h>
#include <rte_interrupts.h>
#include <rte_log.h>
#include <rte_pause.h>

#include "emx_shim.h"

int rte_errno_(void) { return rte_errno; }
unsigned rte_lcore_id_(void) { return rte_lcore_id(); }

/*
 * The unmap guard.
 *
 * When a memif peer goes away (its process killed, say), DPDK 22.11's memif
 * driver tears the connection down on the EAL interrupt thread: it marks the
 * port disconnected, then unmaps the shared regions and frees their
 * descriptors. Nothing holds off a burst that checked the port connected just
 * before and is still copying frames: it reads unmapped memory and the whole
 * process dies of SIGSEGV (measured here: a raw 1 MiB ping-pong between two
 * processes crashed about one kill of the peer in four, on either side).
 *
 * The guard makes the unmap wait for those bursts. Each thread marks its
 * bursts in a slot of its own (an odd count while inside one, two plain
 * stores a burst), and `munmap` called on the interrupt thread first waits
 * until every thread that was inside a burst has left it. A burst that
 * starts after the port was marked disconnected returns at once, so the wait
 * is a burst long. The interrupt thread's stores and the bursts' marks are
 * ordered by membarrier(2), which puts a full barrier on every thread of the
 * process, so that the bursts need no fence of their own.
 *
 * DPDK's drivers are shared libraries: they reach this `munmap`, not libc's,
 * because the executable exports it. GNU ld exports an executable's
 * definition of any symbol that a shared library on its link line uses, and
 * librte_eal, which every emx program links, uses munmap.
 * emx_unmap_guarded() checks. In a static build the link resolves it here.
 */

#define EMX_BURST_SLOTS 256

struct emx_burst_slot {
	/* Odd while its thread is inside a burst. */
	uint64_t seq;
	/* Whether a live thread holds the slot. */
	uint32_t taken;
} __rte_cache_aligned;

static struct emx_burst_slot emx_slots[EMX_BURST_SLOTS];
/* Threads beyond the table count here, inside a burst or not. */
static uint64_t emx_overflow_inside;
static __thread struct emx_burst_slot *emx_my_slot
	__attribute__((tls_model("initial-exec")));
/* How deep this thread is in bursts: one inside another (a burst run from a
 * release callback that a burst called) leaves the marks to the outer one. */
static __thread unsigned emx_depth __attribute__((tls_model("initial-exec")));
static pthread_key_t emx_slot_key;
static pthread_once_t emx_slot_once = PTHREAD_ONCE_INIT;

static void emx_slot_release(void *slot)
{
	/* A free run by a later destructor of this thread claims a slot anew
	 * (and releases it in the destructors' next round). */
	emx_my_slot = NULL;
	__atomic_store_n(&((struct emx_burst_slot *)slot)->taken, 0,
			 __ATOMIC_RELEASE);
}

static void emx_slot_key_init(void)
{
	(void)pthread_key_create(&emx_slot_key, emx_slot_release);
}

/* A slot for this thread, released when it exits; NULL if all are taken. */
static struct emx_burst_slot *emx_slot_claim(void)
{
	unsigned i;

	pthread_once(&emx_slot_once, emx_slot_key_init);
	for (i = 0; i < EMX_BURST_SLOTS; i++) {
		uint32_t free_ = 0;

		if (__atomic_compare_exchange_n(&emx_slots[i].taken, &free_, 1,
						0, __ATOMIC_ACQ_REL,
						__ATOMIC_RELAXED)) {
			uint64_t seq = emx_slots[i].seq;

			/* Left odd by a thread that ended inside: out now. */
			if (seq & 1)
				__atomic_store_n(&emx_slots[i].seq, seq + 1,
						 __ATOMIC_RELEASE);
			emx_my_slot = &emx_slots[i];
			(void)pthread_setspecific(emx_slot_key, emx_my_slot);
			return emx_my_slot;
		}
	}
	return NULL;
}

/* Raised while a dropped mempool is counted and freed (emx_quiesce_begin):
 * bursts and frees that would start wait at their start until it falls. */
static int emx_closing __rte_cache_aligned;

/* Marks this thread in (`in` 1) or out of a burst or free. */
static inline void emx_mark(struct emx_burst_slot *s, int in)
{
	if (s == NULL) {
		if (in)
			__atomic_fetch_add(&emx_overflow_inside, 1,
					   __ATOMIC_SEQ_CST);
		else
			__atomic_fetch_sub(&emx_overflow_inside, 1,
					   __ATOMIC_SEQ_CST);
	} else if (in) {
		__atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELAXED);
		/* The mark precedes what follows it (membarrier orders it
		 * for the thread that reads the marks). */
		__atomic_signal_fence(__ATOMIC_SEQ_CST);
	} else {
		/* What precedes the mark stays before it. */
		__atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELEASE);
	}
}

/* A pool is being counted and freed: step out until it is done. The mark
 * was set before the flag was read, and the reclaimer raises the flag before
 * it reads the marks (membarrier between), so either this thread saw the flag
 * or the reclaimer saw the mark and waits for it to clear. */
static void __attribute__((noinline)) emx_wait_closing(struct emx_burst_slot *s)
{
	do {
		emx_mark(s, 0);
		while (__atomic_load_n(&emx_closing, __ATOMIC_ACQUIRE))
			sched_yield();
		emx_mark(s, 1);
	} while (__atomic_load_n(&emx_closing, __ATOMIC_RELAXED));
}

static inline struct emx_burst_slot *emx_burst_enter(void)
{
	struct emx_burst_slot *s = emx_my_slot;

	if (emx_depth++ != 0)
		return s;
	if (unlikely(s == NULL))
		s = emx_slot_claim();
	emx_mark(s, 1);
	if (unlikely(__atomic_load_n(&emx_closing, __ATOMIC_RELAXED)))
		emx_wait_closing(s);
	return s;
}

static inline void emx_burst_leave(struct emx_burst_slot *s)
{
	if (--emx_depth != 0)
		return;
	emx_mark(s, 0);
}

/* A full barrier on every thread of the process: 0, or -1 where only a
 * pause could stand in for one. */
static int emx_barrier_all_threads(void)
{
	static int registered;

	if (!__atomic_load_n(&registered, __ATOMIC_RELAXED) &&
	    syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
		    0, 0) == 0)
		__atomic_store_n(&registered, 1, __ATOMIC_RELAXED);
	if (__atomic_load_n(&registered, __ATOMIC_RELAXED) &&
	    syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
		return 0;
	if (syscall(__NR_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0)
		return 0;
	/* No membarrier (an old kernel, a seccomp filter): a store buffer
	 * drains in far less than this, which the unmap guard settles for. */
	usleep(1000);
	return -1;
}

/* Whether `deadline` (CLOCK_MONOTONIC) has passed. */
static int emx_past(const struct timespec *deadline)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > deadline->tv_sec ||
	       (now.tv_sec == deadline->tv_sec &&
		now.tv_nsec >= deadline->tv_nsec);
}

/* Waits until every burst and free in progress when it was called has ended,
 * or `deadline` (if any) passes: 0, -EBUSY, or -ENOSYS without membarrier
 * when `sure` (then the marks may be read too early). */
static int emx_wait_marks(const struct timespec *deadline, int sure)
{
	unsigned i;

	if (emx_barrier_all_threads() != 0 && sure)
		return -ENOSYS;
	for (i = 0; i < EMX_BURST_SLOTS; i++) {
		uint64_t seq = __atomic_load_n(&emx_slots[i].seq,
					       __ATOMIC_ACQUIRE);

		if ((seq & 1) == 0)
			continue;
		while (__atomic_load_n(&emx_slots[i].seq, __ATOMIC_ACQUIRE) ==
		       seq)
			if (deadline != NULL && emx_past(deadline))
				return -EBUSY;
			else
				sched_yield();
	}
	while (__atomic_load_n(&emx_overflow_inside, __ATOMIC_ACQUIRE) != 0)
		if (deadline != NULL && emx_past(deadline))
			return -EBUSY;
		else
			sched_yield();
	return 0;
}

/* Waits until every burst in progress when it was called has ended. */
void emx_wait_for_bursts(void)
{
	(void)emx_wait_marks(NULL, 0);
}

int munmap(void *addr, size_t len)
{
	if (rte_thread_is_intr())
		emx_wait_for_bursts();
	return (int)syscall(SYS_munmap, addr, len);
}

int emx_unmap_guarded(void)
{
	return dlsym(RTLD_DEFAULT, "munmap") == (void *)munmap;
}

/*
 * Holding the interrupt thread.
 *
 * DPDK 22.11's memif driver keeps its control channels, its regions and each
 * socket's list of interfaces in state that two threads edit without a common
 * lock: the EAL interrupt thread, which runs memif's message handlers (a
 * peer's hello, init, disconnect), and whichever thread probes, stops, closes
 * or removes a memif port. When one port of an in-process pair stops, its
 * disconnect reaches the other on the interrupt thread, and stopping that
 * other port at the same moment corrupted memif's state ("EAL: Error: Invalid
 * memory" from rte_free, then SIGSEGV on the interrupt thread).
 *
 * The interrupt thread runs its handlers one at a time. So a thread about to
 * edit that state wakes a source of emx's own (an eventfd) whose callback
 * parks the interrupt thread until it is released: once parked, no handler
 * is running, and none starts before the release. The release then waits for
 * a second wake-up of the same source, which the thread can only take in a
 * later round of epoll_wait: the events it had gathered before parking, some
 * of them for file descriptors closed meanwhile (whose numbers a new socket
 * may take), are all handled before the releaser goes on.
 *
 * DPDK 22.11's rte_eal_cleanup, for its part, unmaps the EAL's memory while
 * the interrupt thread still runs, and that thread reads interrupt handles
 * kept there whenever it wakes: to rebuild its wait list after a source is
 * unregistered (cleanup unregisters the alarm source itself), or for a late
 * event. So before cleanup emx parks it for good, through the same source.
 * The source is not an alarm: an alarm callback that parks would make
 * cleanup, which waits for the alarm source to go idle, wait for ever.
 *
 * The source, its handle and the EAL's copies of them are in libc memory (a
 * private instance), and live as long as the process. Callers take turns
 * (dpdk-ffi asks under its control lock).
 */

/* `timeout_ms` from now on CLOCK_MONOTONIC. */
static void emx_deadline(unsigned timeout_ms, struct timespec *deadline)
{
	clock_gettime(CLOCK_MONOTONIC, deadline);
	deadline->tv_sec += timeout_ms / 1000;
	deadline->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (deadline->tv_nsec >= 1000000000L) {
		deadline->tv_sec++;
		deadline->tv_nsec -= 1000000000L;
	}
}

enum { EMX_ASK_NONE, EMX_ASK_PARK, EMX_ASK_BARRIER, EMX_ASK_STOP };
enum { EMX_INTR_RUNNING, EMX_INTR_PARKED, EMX_INTR_PASSED, EMX_INTR_STOPPED };

static pthread_once_t emx_intr_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t emx_intr_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t emx_intr_cond;
static int emx_intr_fd = -1;
/* What the asker wants, and where the interrupt thread is; both under
 * emx_intr_lock. */
static int emx_intr_ask = EMX_ASK_NONE;
static int emx_intr_state = EMX_INTR_RUNNING;

static void emx_intr_callback(void *arg)
{
	uint64_t n;

	(void)arg;
	/* Level-triggered: take the wake-up, or it comes back at once. */
	if (read(emx_intr_fd, &n, sizeof(n)) < 0) {
		/* EAGAIN: an earlier call took it. */
	}
	pthread_mutex_lock(&emx_intr_lock);
	switch (emx_intr_ask) {
	case EMX_ASK_PARK:
		emx_intr_state = EMX_INTR_PARKED;
		pthread_cond_broadcast(&emx_intr_cond);
		while (emx_intr_ask == EMX_ASK_PARK)
			pthread_cond_wait(&emx_intr_cond, &emx_intr_lock);
		emx_intr_state = EMX_INTR_RUNNING;
		break;
	case EMX_ASK_BARRIER:
		emx_intr_ask = EMX_ASK_NONE;
		emx_intr_state = EMX_INTR_PASSED;
		pthread_cond_broadcast(&emx_intr_cond);
		break;
	case EMX_ASK_STOP:
		emx_intr_state = EMX_INTR_STOPPED;
		pthread_cond_broadcast(&emx_intr_cond);
		for (;;)
			pthread_cond_wait(&emx_intr_cond, &emx_intr_lock);
	default:
		/* An asker that gave up: nothing to do. */
		break;
	}
	pthread_mutex_unlock(&emx_intr_lock);
}

static int emx_intr_setup_err;

static void emx_intr_setup(void)
{
	struct rte_intr_handle *handle;
	pthread_condattr_t attr;

	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&emx_intr_cond, &attr);
	pthread_condattr_destroy(&attr);
	emx_intr_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (emx_intr_fd < 0) {
		emx_intr_setup_err = -errno;
		return;
	}
	handle = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
	if (handle == NULL) {
		emx_intr_setup_err = -ENOMEM;
	} else if (rte_intr_fd_set(handle, emx_intr_fd) != 0 ||
		   rte_intr_type_set(handle, RTE_INTR_HANDLE_EXT) != 0 ||
		   rte_intr_callback_register(handle, emx_intr_callback,
					      NULL) != 0) {
		emx_intr_setup_err = -EINVAL;
		rte_intr_instance_free(handle);
	}
	if (emx_intr_setup_err != 0) {
		close(emx_intr_fd);
		emx_intr_fd = -1;
	}
}

/* Asks `ask` of the interrupt thread and waits up to `timeout_ms` for it to
 * reach `state`; with emx_intr_lock held. 0, or -ETIMEDOUT having withdrawn
 * the request (a late callback then finds nothing to do). */
static int emx_intr_ask_for(int ask, int state, unsigned timeout_ms)
{
	struct timespec deadline;
	uint64_t one = 1;

	emx_intr_ask = ask;
	/* A parked thread waits for its request to change. */
	pthread_cond_broadcast(&emx_intr_cond);
	if (write(emx_intr_fd, &one, sizeof(one)) != sizeof(one)) {
		/* Only a counter at its limit refuses, and it is then readable. */
	}
	emx_deadline(timeout_ms, &deadline);
	while (emx_intr_state != state)
		if (pthread_cond_timedwait(&emx_intr_cond, &emx_intr_lock,
					   &deadline) != 0 &&
		    emx_intr_state != state) {
			emx_intr_ask = EMX_ASK_NONE;
			return -ETIMEDOUT;
		}
	return 0;
}

/* Sets the source up once; 0, -EDEADLK on the interrupt thread itself (where
 * nothing else runs anyway), or why it could not be. */
static int emx_intr_ready(void)
{
	if (rte_thread_is_intr())
		return -EDEADLK;
	pthread_once(&emx_intr_once, emx_intr_setup);
	return emx_intr_setup_err;
}

/* Sets the source up if need be, and asks `ask` of the thread (see
 * emx_intr_ask_for). */
static int emx_intr_request(int ask, int state, unsigned timeout_ms)
{
	int ret = emx_intr_ready();

	if (ret != 0)
		return ret;
	pthread_mutex_lock(&emx_intr_lock);
	ret = emx_intr_ask_for(ask, state, timeout_ms);
	pthread_mutex_unlock(&emx_intr_lock);
	return ret;
}

int emx_intr_hold(unsigned timeout_ms)
{
	return emx_intr_request(EMX_ASK_PARK, EMX_INTR_PARKED, timeout_ms);
}

int emx_intr_release(unsigned timeout_ms)
{
	int ret;

	pthread_mutex_lock(&emx_intr_lock);
	/* Ends the park (its loop sees the request change), then waits for the
	 * thread to come round again. */
	ret = emx_intr_ask_for(EMX_ASK_BARRIER, EMX_INTR_PASSED, timeout_ms);
	emx_intr_state = EMX_INTR_RUNNING;
	pthread_mutex_unlock(&emx_intr_lock);
	return ret;
}

int emx_intr_stop(unsigned timeout_ms)
{
	return emx_intr_request(EMX_ASK_STOP, EMX_INTR_STOPPED, timeout_ms);
}

static __thread struct emx_burst_slot *emx_held;

void emx_burst_hold(int inside)
{
	if (inside)
		emx_held = emx_burst_enter();
	else
		emx_burst_leave(emx_held);
}

uint16_t rte_eth_rx_burst_(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **rx_pkts, uint16_t nb_pkts)
{
	struct emx_burst_slot *s = emx_burst_enter();
	uint16_t n = rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);

	emx_burst_leave(s);
	return n;
}

uint16_t rte_eth_tx_burst_(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **tx_pkts, uint16_t nb_pkts)
{
	struct emx_burst_slot *s = emx_burst_enter();
	uint16_t n = rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);

	emx_burst_leave(s);
	return n;
}

int rte_eth_tx_done_cleanup_(uint16_t port_id, uint16_t queue_id,
			     uint32_t free_cnt)
{
	/* The driver puts the mbufs back into their pools, which may be any
	 * pools, retired ones too: marked, as every other put is. */
	struct emx_burst_slot *s = emx_burst_enter();
	int n = rte_eth_tx_done_cleanup(port_id, queue_id, free_cnt);

	emx_burst_leave(s);
	return n;
}

struct rte_mbuf *rte_pktmbuf_alloc_(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int rte_pktmbuf_alloc_bulk_(struct rte_mempool *mp, struct rte_mbuf **mbufs,
			    unsigned count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

/*
 * Mbuf frees, marked as the bursts are.
 *
 * A mempool whose last handle goes is freed only if none of its mbufs is out.
 * The count says so as soon as the last one is back, while the thread that
 * put it back may still be inside the put (flushing its cache into the
 * pool's ring, say, which also counts some mbufs twice for a moment): freeing
 * the pool then would pull the memory from under it. So puts mark themselves
 * in their thread's slot, like bursts, and a dropped pool is counted between
 * emx_quiesce_begin and emx_quiesce_end: those wait (bounded) for the bursts
 * and frees in progress to end, and hold new ones at their start meanwhile.
 * A count taken then is exact; if it is 0, nothing touches the pool after it
 * (a put needs an mbuf out, and the one put that needs none, the cache flush
 * at a thread's unregistration, walks the pool list, whose write lock
 * emx_mempool_free takes), so the pool is freed once the window has closed.
 *
 * The marks cover the puts and never the release callback of an external
 * buffer, which runs code of the buffer's owner (that may drop a pool, take
 * a lock, or wait): those run outside, between marks. A put inside a burst
 * (a driver freeing sent frames) is inside the burst's marks already.
 */
static inline struct rte_mbuf *emx_prefree_seg(struct rte_mbuf *m,
					      struct emx_burst_slot **s)
{
	if (unlikely(RTE_MBUF_HAS_EXTBUF(m) && !RTE_MBUF_HAS_PINNED_EXTBUF(m))) {
		/* The release callback runs outside the marks (unless this
		 * free is itself inside a burst, whose marks stay). */
		emx_burst_leave(*s);
		m = rte_pktmbuf_prefree_seg(m);
		*s = emx_burst_enter();
		return m;
	}
	return rte_pktmbuf_prefree_seg(m);
}

#define EMX_FREE_PENDING 64

void rte_pktmbuf_free_bulk_(struct rte_mbuf **mbufs, unsigned count)
{
	struct rte_mbuf *pending[EMX_FREE_PENDING], *m, *next;
	struct emx_burst_slot *s = emx_burst_enter();
	unsigned i, n = 0;

	/* DPDK's rte_pktmbuf_free_bulk, with the marks. */
	for (i = 0; i < count; i++) {
		for (m = mbufs[i]; m != NULL; m = next) {
			next = m->next;
			m = emx_prefree_seg(m, &s);
			if (m == NULL)
				continue;
			if (n == EMX_FREE_PENDING ||
			    (n > 0 && pending[0]->pool != m->pool)) {
				rte_mempool_put_bulk(pending[0]->pool,
						     (void **)pending, n);
				n = 0;
			}
			pending[n++] = m;
		}
	}
	if (n > 0)
		rte_mempool_put_bulk(pending[0]->pool, (void **)pending, n);
	emx_burst_leave(s);
}

void rte_pktmbuf_free_(struct rte_mbuf *m) { rte_pktmbuf_free_bulk_(&m, 1); }

int emx_in_section(void) { return emx_depth != 0; }

int emx_quiesce_begin(unsigned timeout_ms)
{
	struct timespec deadline;
	int ret;

	/* This thread's own mark would never clear. */
	if (emx_depth != 0)
		return -EDEADLK;
	emx_deadline(timeout_ms, &deadline);
	/* First without the flag, so that one burst stuck (in a release
	 * callback waiting for a lock) holds nobody else up: give up here. */
	ret = emx_wait_marks(&deadline, 1);
	if (ret != 0)
		return ret;
	__atomic_store_n(&emx_closing, 1, __ATOMIC_SEQ_CST);
	/* Every mark set before the flag was seen is seen now, with all that
	 * the burst or free it ended did; those begun since the first wait
	 * are waited for, and the rest wait at their start. */
	ret = emx_wait_marks(&deadline, 1);
	if (ret != 0)
		emx_quiesce_end();
	return ret;
}

void emx_quiesce_end(void)
{
	__atomic_store_n(&emx_closing, 0, __ATOMIC_RELEASE);
}

void emx_mempool_free(struct rte_mempool *mp)
{
	/* rte_mempool_walk's lock: no walk (DPDK's telemetry, say) reads the
	 * pool as it goes. */
	rte_mcfg_mempool_write_lock();
	rte_mempool_free(mp);
	rte_mcfg_mempool_write_unlock();
}

char *rte_pktmbuf_append_(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_append(m, len);
}

char *rte_pktmbuf_prepend_(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_prepend(m, len);
}

char *rte_pktmbuf_adj_(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_adj(m, len);
}

int rte_pktmbuf_trim_(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_trim(m, len);
}

int rte_pktmbuf_chain_(struct rte_mbuf *head, struct rte_mbuf *tail)
{
	return rte_pktmbuf_chain(head, tail);
}

uint16_t rte_pktmbuf_headroom_(const struct rte_mbuf *m)
{
	return rte_pktmbuf_headroom(m);
}

uint16_t rte_pktmbuf_tailroom_(const struct rte_mbuf *m)
{
	return rte_pktmbuf_tailroom(m);
}

uint16_t rte_mbuf_refcnt_read_(const struct rte_mbuf *m)
{
	return rte_mbuf_refcnt_read(m);
}

uint16_t rte_pktmbuf_data_room_size_(struct rte_mempool *mp)
{
	return rte_pktmbuf_data_room_size(mp);
}

void rte_pktmbuf_attach_extbuf_(struct rte_mbuf *m, void *buf_addr,
				rte_iova_t buf_iova, uint16_t buf_len,
				struct rte_mbuf_ext_shared_info *shinfo)
{
	rte_pktmbuf_attach_extbuf(m, buf_addr, buf_iova, buf_len, shinfo);
}

uint16_t rte_mbuf_ext_refcnt_update_(struct rte_mbuf_ext_shared_info *shinfo,
				     int16_t value)
{
	return rte_mbuf_ext_refcnt_update(shinfo, value);
}

int rte_mbuf_has_extbuf_(const struct rte_mbuf *m)
{
	return RTE_MBUF_HAS_EXTBUF(m) ? 1 : 0;
}

static void flush_one(struct rte_mempool *mp, void *arg)
{
	struct rte_mempool_cache *cache;

	(void)arg;
	cache = rte_mempool_default_cache(mp, rte_lcore_id());
	if (cache != NULL)
		rte_mempool_cache_flush(cache, mp);
}

void emx_flush_mempool_caches(void)
{
	/* Puts into the pools' rings: marked, as frees are. */
	struct emx_burst_slot *s = emx_burst_enter();

	rte_mempool_walk(flush_one, NULL);
	emx_burst_leave(s);
}

/*
 * libbpf and libxdp both number their levels WARN = 0, INFO = 1, DEBUG = 2.
 * Without a bpffs, libxdp also warns, on every attach and detach, that it
 * cannot use its multi-program dispatcher, and then loads the driver's program
 * alone, which is all a port needs: those warnings go too.
 */
static int emx_bpf_warnings_only(int level, const char *fmt, va_list ap)
{
	if (level > 0 || strstr(fmt, "bpffs") != NULL ||
	    strstr(fmt, "dispatcher") != NULL)
		return 0;
	return vfprintf(stderr, fmt, ap);
}

typedef int (*emx_print_fn)(int level, const char *fmt, va_list ap);
typedef emx_print_fn (*emx_set_print_fn)(emx_print_fn fn);

/* Installs the filter with `setter` of `lib`, if the process has it loaded. */
static void emx_filter_prints(const char *lib, const char *setter)
{
	void *h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
	emx_set_print_fn set;

	if (h == NULL)
		return;
	*(void **)&set = dlsym(h, setter);
	if (set != NULL)
		set(emx_bpf_warnings_only);
	dlclose(h);
}

void emx_quiet_bpf_logs(void)
{
	emx_filter_prints("libbpf.so.1", "libbpf_set_print");
	emx_filter_prints("libxdp.so.1", "libxdp_set_print");
}

int emx_log_through(emx_log_write write)
{
	cookie_io_functions_t io = { .write = write };
	FILE *f = fopencookie(NULL, "w", io);

	if (f == NULL)
		return -1;
	/*
	 * Unbuffered: glibc then formats each fprintf into a buffer of the
	 * call's own and writes it once, so that one write is one message of
	 * one thread (whose level emx_log_level reads). With a shared buffer,
	 * another thread's message could join one between DPDK's fprintf and
	 * its fflush, and go out under the flushing thread's level.
	 */
	setvbuf(f, NULL, _IONBF, 0);
	return rte_openlog_stream(f);
}

int emx_log_level(void)
{
	return rte_log_cur_msg_loglevel();
}

uint64_t rte_rdtsc_(void) { return rte_rdtsc(); }
