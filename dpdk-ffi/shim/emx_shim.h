/*
 * The DPDK surface emx uses: the public headers bindgen reads, plus exported
 * copies of the `static inline` fast-path functions, macros and per-thread
 * values that Rust cannot bind directly. Each exported copy is named after
 * the DPDK function with a trailing underscore (Demikernel's convention) and
 * re-exported under DPDK's own name by `dpdk_ffi::sys`.
 */
#ifndef EMX_SHIM_H
#define EMX_SHIM_H

#include <stdint.h>
#include <sys/types.h>
#include <rte_common.h>
#include <rte_errno.h>
#include <rte_eal.h>
#include <rte_lcore.h>
#include <rte_memory.h>
#include <rte_dev.h>
#include <rte_bus.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ethdev.h>
#include <rte_cycles.h>

/* Per-thread values: Rust cannot bind C thread-locals. */
int rte_errno_(void);
unsigned rte_lcore_id_(void);

/*
 * Ethernet device fast path. The bursts mark themselves for the unmap guard
 * (see emx_shim.c): a driver that unmaps a port's memory on the interrupt
 * thread waits for the bursts in progress.
 */
uint16_t rte_eth_rx_burst_(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **rx_pkts, uint16_t nb_pkts);
uint16_t rte_eth_tx_burst_(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **tx_pkts, uint16_t nb_pkts);
/* Frees the transmitted mbufs a driver still holds, into their pools: marked
 * as a burst is (see emx_shim.c, "Mbuf frees, marked as the bursts are"). */
int rte_eth_tx_done_cleanup_(uint16_t port_id, uint16_t queue_id,
			     uint32_t free_cnt);

/* Packet mbufs. */
struct rte_mbuf *rte_pktmbuf_alloc_(struct rte_mempool *mp);
int rte_pktmbuf_alloc_bulk_(struct rte_mempool *mp, struct rte_mbuf **mbufs,
			    unsigned count);
void rte_pktmbuf_free_(struct rte_mbuf *m);
void rte_pktmbuf_free_bulk_(struct rte_mbuf **mbufs, unsigned count);
char *rte_pktmbuf_append_(struct rte_mbuf *m, uint16_t len);
char *rte_pktmbuf_prepend_(struct rte_mbuf *m, uint16_t len);
char *rte_pktmbuf_adj_(struct rte_mbuf *m, uint16_t len);
int rte_pktmbuf_trim_(struct rte_mbuf *m, uint16_t len);
int rte_pktmbuf_chain_(struct rte_mbuf *head, struct rte_mbuf *tail);
uint16_t rte_pktmbuf_headroom_(const struct rte_mbuf *m);
uint16_t rte_pktmbuf_tailroom_(const struct rte_mbuf *m);
uint16_t rte_mbuf_refcnt_read_(const struct rte_mbuf *m);
uint16_t rte_pktmbuf_data_room_size_(struct rte_mempool *mp);

/* External buffers: the zero-copy send primitive. */
void rte_pktmbuf_attach_extbuf_(struct rte_mbuf *m, void *buf_addr,
				rte_iova_t buf_iova, uint16_t buf_len,
				struct rte_mbuf_ext_shared_info *shinfo);
uint16_t rte_mbuf_ext_refcnt_update_(struct rte_mbuf_ext_shared_info *shinfo,
				     int16_t value);
int rte_mbuf_has_extbuf_(const struct rte_mbuf *m);

/* Flush this lcore's cache of every mempool (before rte_thread_unregister). */
void emx_flush_mempool_caches(void);

/*
 * libbpf and libxdp, which the AF_XDP driver loads, print informational
 * messages of their own on stderr (some fifty lines for a few AF_XDP ports
 * where no bpffs is mounted). Keep their warnings, less those about libxdp's
 * dispatcher and bpffs, and drop the rest. Call after rte_eal_init (which
 * loads the drivers); where neither library is loaded it does nothing.
 */
void emx_quiet_bpf_logs(void);

/*
 * Sends DPDK's log messages to `write` (with a NULL cookie) instead of its
 * default stream, unbuffered: each call is one message of the calling
 * thread (glibc formats an fprintf to an unbuffered stream whole, in pieces
 * past 8 KiB). 0 or -1.
 */
typedef ssize_t (*emx_log_write)(void *cookie, const char *buf, size_t size);
int emx_log_through(emx_log_write write);
/* The level (RTE_LOG_ERR...) of the message this thread is writing. */
int emx_log_level(void);

uint64_t rte_rdtsc_(void);

/*
 * 1 if DPDK's drivers unmap memory through the unmap guard (the executable
 * exports `munmap`, or links the drivers statically), 0 if they reach libc's.
 */
int emx_unmap_guarded(void);

/*
 * The EAL interrupt thread, held still (see emx_shim.c). Callers take turns.
 * emx_intr_hold parks it in a callback of emx's own, so that no driver
 * handler runs until emx_intr_release, which also waits for it to finish the
 * events it had gathered before parking. emx_intr_stop parks it for good,
 * before rte_eal_cleanup. Each returns 0, or -ETIMEDOUT when the thread did
 * not get there within `timeout_ms` (the request is then withdrawn); hold and
 * stop return -EDEADLK on the interrupt thread itself (where no other handler
 * can be running anyway), or a negative errno when emx's source could not be
 * set up.
 */
int emx_intr_hold(unsigned timeout_ms);
int emx_intr_release(unsigned timeout_ms);
int emx_intr_stop(unsigned timeout_ms);

/*
 * A window in which no thread is inside a burst or an mbuf free, for counting
 * and freeing dropped mempools (see emx_shim.c). emx_quiesce_begin holds new
 * bursts and frees at their start and waits for those in progress: 0 once
 * they have ended; -EBUSY if they did not within `timeout_ms` (the window is
 * then closed again); -EDEADLK when called inside a burst or a free; -ENOSYS
 * where the kernel has no membarrier(2).
 * emx_quiesce_end lets them go on. emx_mempool_free frees a pool, excluding
 * DPDK's walks of the pool list. emx_in_section says whether this thread is
 * inside a burst or a free.
 */
int emx_quiesce_begin(unsigned timeout_ms);
void emx_quiesce_end(void);
void emx_mempool_free(struct rte_mempool *mp);
int emx_in_section(void);

/* What the guard's munmap waits with, and a burst's marks without the burst
 * (`inside` 1: enter, 0: leave), for its tests. */
void emx_wait_for_bursts(void);
void emx_burst_hold(int inside);

#endif
