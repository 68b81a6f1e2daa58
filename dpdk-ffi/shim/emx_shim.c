#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "emx_shim.h"

int rte_errno_(void) { return rte_errno; }
unsigned rte_lcore_id_(void) { return rte_lcore_id(); }

uint16_t rte_eth_rx_burst_(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **rx_pkts, uint16_t nb_pkts)
{
	return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t rte_eth_tx_burst_(uint16_t port_id, uint16_t queue_id,
			   struct rte_mbuf **tx_pkts, uint16_t nb_pkts)
{
	return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
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

void rte_pktmbuf_free_(struct rte_mbuf *m) { rte_pktmbuf_free(m); }

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
	rte_mempool_walk(flush_one, NULL);
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

uint64_t rte_rdtsc_(void) { return rte_rdtsc(); }
