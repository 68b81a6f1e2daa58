//! Pools of packet mbufs.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::eal::Eal;
use crate::error::{Error, Result, ToResult};
use crate::port::ETHER_OVERHEAD;
use crate::sys;

/// Data room of a default mbuf: 2048 bytes plus the headroom, enough for a
/// 1500-byte MTU frame in one segment.
pub const DEFAULT_DATA_ROOM: u16 = sys::RTE_MBUF_DEFAULT_BUF_SIZE as u16;

/// The data room for frames of `mtu` in one segment: the frame (the MTU, the
/// Ethernet header and CRC) and the headroom, and never less than
/// [`DEFAULT_DATA_ROOM`].
///
/// ```
/// use dpdk_ffi::{data_room_for_mtu, DEFAULT_DATA_ROOM};
/// assert_eq!(data_room_for_mtu(1500), DEFAULT_DATA_ROOM);
/// assert_eq!(data_room_for_mtu(9000), 9000 + 18 + 128);
/// ```
pub fn data_room_for_mtu(mtu: u16) -> u16 {
    DEFAULT_DATA_ROOM.max(mtu.saturating_add((ETHER_OVERHEAD + sys::RTE_PKTMBUF_HEADROOM) as u16))
}

/// A pool of packet mbufs (`rte_pktmbuf_pool_create`). Clones share the pool;
/// it is freed when the last clone and every port using it are gone, once no
/// mbuf of it is out and no thread is still inside putting one back: never
/// under a live mbuf. A pool dropped with mbufs out keeps its name (a new pool
/// by that name is refused, saying why) until they are back and the next
/// pool is made or dropped; if the EAL ends first, its memory stays mapped.
#[derive(Clone)]
pub struct Mempool(Arc<PoolInner>);

struct PoolInner {
    raw: NonNull<sys::rte_mempool>,
    name: String,
    size: u32,
    data_room: u16,
    /// The most mbufs that closed ports' drivers may keep for good (see
    /// [`Mempool::kept_by_driver`]).
    kept: std::sync::atomic::AtomicU32,
    _eal: Eal,
}

// SAFETY: DPDK mempools are multi-producer/multi-consumer safe; the handle only
// holds the pointer and immutable metadata.
unsafe impl Send for PoolInner {}
// SAFETY: as above: concurrent get/put from several threads is what the
// mempool ring is built for.
unsafe impl Sync for PoolInner {}

impl std::fmt::Debug for Mempool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mempool")
            .field("name", &self.0.name)
            .field("size", &self.0.size)
            .field("data_room", &self.0.data_room)
            .finish()
    }
}

impl Mempool {
    /// Creates a pool of `size` mbufs (best as 2^k - 1), with a per-lcore cache
    /// of `cache` mbufs and `data_room` bytes of buffer each (headroom
    /// included; [`DEFAULT_DATA_ROOM`] fits a 1500-byte MTU frame).
    pub fn new(eal: &Eal, name: &str, size: u32, cache: u32, data_room: u16) -> Result<Mempool> {
        // RTE_MEMPOOL_NAMESIZE is 26 with the terminating NUL, and the ring
        // underneath adds a 3-byte prefix to the same limit.
        if name.is_empty() || name.len() > 22 {
            return Err(Error::Config(format!(
                "mempool name `{name}` must be 1 to 22 bytes"
            )));
        }
        if u32::from(data_room) <= sys::RTE_PKTMBUF_HEADROOM {
            return Err(Error::Config(format!(
                "mempool data room {data_room} must exceed the {} byte headroom",
                sys::RTE_PKTMBUF_HEADROOM
            )));
        }
        // DPDK's rules for the cache, which it answers with a bare EINVAL.
        // (Its flush threshold, 1.5 times the cache, truncated, within the pool.)
        let threshold = u64::from(cache) * 3 / 2;
        if cache > sys::RTE_MEMPOOL_CACHE_MAX_SIZE || threshold > u64::from(size) {
            return Err(Error::Config(format!(
                "mempool `{name}` of {size} mbufs: DPDK takes a per-lcore cache of at most \
                 {} mbufs and of at most 2/3 of the pool; asked for {cache}: give it a \
                 smaller cache or at least {threshold} mbufs",
                sys::RTE_MEMPOOL_CACHE_MAX_SIZE
            )));
        }
        let cname =
            CString::new(name).map_err(|_| Error::Config("mempool name contains NUL".into()))?;
        // A pool dropped earlier and still waiting may hold the name (the
        // control lock keeps others from taking the list meanwhile).
        let _control = crate::control::control();
        reclaim(RECLAIM_WAIT_MS);
        if name_waiting(name) {
            return Err(Error::Config(format!(
                "a mempool named `{name}` was dropped with mbufs still out (or while a burst \
                 was stuck) and is not freed yet: free those mbufs first, or give this pool \
                 another name"
            )));
        }
        // SAFETY: a valid name; the EAL is running (we hold a handle); the
        // returned pointer is owned by this handle until freed in Drop.
        let raw = unsafe {
            sys::rte_pktmbuf_pool_create(
                cname.as_ptr(),
                size,
                cache,
                0,
                data_room,
                sys::SOCKET_ID_ANY,
            )
        }
        .check("rte_pktmbuf_pool_create")?;
        Ok(Mempool(Arc::new(PoolInner {
            raw,
            name: name.to_string(),
            size,
            data_room,
            kept: std::sync::atomic::AtomicU32::new(0),
            _eal: eal.clone(),
        })))
    }

    /// The raw pool, for the raw bindings in [`sys`](crate::sys).
    pub fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.0.raw.as_ptr()
    }

    /// The EAL the pool lives in.
    pub fn eal(&self) -> &Eal {
        &self.0._eal
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Number of mbufs in the pool.
    pub fn size(&self) -> u32 {
        self.0.size
    }

    /// Buffer bytes per mbuf, headroom included.
    pub fn data_room(&self) -> u16 {
        self.0.data_room
    }

    /// Mbufs available (in the pool and in per-lcore caches).
    pub fn available(&self) -> u32 {
        // SAFETY: the pool is alive while self is.
        unsafe { sys::rte_mempool_avail_count(self.as_ptr()) }
    }

    /// Mbufs taken out and not yet returned.
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool is alive while self is.
        unsafe { sys::rte_mempool_in_use_count(self.as_ptr()) }
    }

    /// Notes that a closed port's driver may keep up to `n` of this pool's
    /// mbufs for good: DPDK 22.11's `net_af_xdp` does not give back those of
    /// its fill ring, nor those its transmit rings held, when the port
    /// closes. A pool dropped with no more than these out waits for them as
    /// any other (they never come back, so its memory stays until the
    /// process exits), but says nothing of it: it is not the application's
    /// leak, and there is nothing to fix.
    pub(crate) fn kept_by_driver(&self, n: u32) {
        self.0
            .kept
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn exhausted(&self) -> Error {
        Error::MempoolExhausted {
            pool: self.0.name.clone(),
            size: self.0.size,
        }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Counted and freed once no put is in progress (see `reclaim`).
        retired().push(Retired {
            raw: self.raw,
            name: std::mem::take(&mut self.name),
            out: 0,
            kept: *self.kept.get_mut(),
            warned: false,
        });
        reclaim(RECLAIM_WAIT_MS);
    }
}

/// A pool whose last handle is gone, waiting to be counted and freed.
struct Retired {
    raw: NonNull<sys::rte_mempool>,
    name: String,
    /// Its mbufs out when last counted.
    out: u32,
    /// The most of those that closed ports' drivers may keep for good (not
    /// reported).
    kept: u32,
    /// Whether they have been reported.
    warned: bool,
}

impl Retired {
    /// Whether some of its mbufs out are not the ones drivers keep (frames
    /// not freed, or a burst or free still running), or they could not be
    /// counted (`out` 0 in a pool still waiting).
    fn unexplained(&self) -> bool {
        self.out == 0 || self.out > self.kept
    }
}

// SAFETY: only the pointer travels, to be counted and freed in `reclaim`.
unsafe impl Send for Retired {}

/// Pools whose last handle is gone and that are not freed yet. Held only
/// briefly: never across a wait, so a thread inside a burst may push to it.
static RETIRED: std::sync::Mutex<Vec<Retired>> = std::sync::Mutex::new(Vec::new());

fn retired() -> std::sync::MutexGuard<'static, Vec<Retired>> {
    RETIRED.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long a pool's drop waits for the bursts and frees in progress.
const RECLAIM_WAIT_MS: u32 = 50;

/// Frees the pools whose last handle is gone and none of whose mbufs is out;
/// returns how many are left waiting.
///
/// The count says an mbuf is back as soon as it is, while the thread that put
/// it back may still be inside the put, using the pool (flushing its cache
/// into the pool's ring, say, which also counts some mbufs twice for a
/// moment). So the pools are counted in a window in which no thread is inside
/// an mbuf free or a burst: bursts and frees that would start wait at their
/// start, and those in progress are waited for, up to `wait_ms` (see the C
/// shim). A count of 0 taken there is exact, and no put into the pool can
/// start after it (a put needs an mbuf out, and the cache flush at a thread's
/// unregistration walks DPDK's pool list, which the free takes the lock of),
/// so the pools are freed after the window closes. It is opened under the
/// control lock, so that no port's teardown, whose driver puts back the
/// mbufs its queues held, runs meanwhile.
///
/// A pool stays waiting while some of its mbufs are out (reported once), and
/// all of them do when the window cannot be opened: a burst stuck in a
/// release callback, no membarrier(2), or this thread inside a burst or a
/// free (a pool dropped by a release callback that a burst ran), where it
/// cannot wait. The next pool's drop, `Mempool::new` and the EAL's end try
/// again; until then the pool keeps its name and its memory.
pub(crate) fn reclaim(wait_ms: u32) -> usize {
    // SAFETY: reads this thread's depth.
    if unsafe { sys::emx_in_section() } != 0 {
        // Waiting for the control lock here could hold up its holder's
        // window (and the interrupt thread's unmap guard) on this thread.
        return retired().len();
    }
    let _control = crate::control::control();
    let mut pools = std::mem::take(&mut *retired());
    let mut free = Vec::new();
    if !pools.is_empty() {
        if let Some(_window) = Window::open(wait_ms) {
            // Only counts here, printing nothing: bursts everywhere wait.
            let mut i = 0;
            while i < pools.len() {
                // SAFETY: a pool no handle refers to, not yet freed.
                let in_use = unsafe { sys::rte_mempool_in_use_count(pools[i].raw.as_ptr()) };
                if in_use == 0 {
                    free.push(pools.swap_remove(i));
                } else {
                    pools[i].out = in_use;
                    i += 1;
                }
            }
        }
    }
    for pool in free {
        // SAFETY: none of its mbufs is out, no put into it is in progress
        // and none can start (see above), and no port refers to it (ports
        // hold a handle): nothing touches it again.
        unsafe { sys::emx_mempool_free(pool.raw.as_ptr()) };
    }
    for pool in pools
        .iter_mut()
        .filter(|p| p.out > 0 && p.unexplained() && !p.warned)
    {
        pool.warned = true;
        let kept = match pool.kept {
            0 => String::new(),
            k => {
                format!("; closed AF_XDP ports may keep up to {k} in their fill and transmit rings")
            }
        };
        eprintln!(
            "dpdk-ffi: mempool `{}` dropped with {} mbufs still out (frames not freed{kept}); it \
             keeps its name and memory until they are back, and is freed by the next pool made or \
             dropped then",
            pool.name, pool.out
        );
    }
    let mut retired = retired();
    retired.append(&mut pools);
    retired.len()
}

/// The shim's window in which no burst or free runs, closed when dropped
/// (also by a panic).
struct Window;

impl Window {
    fn open(wait_ms: u32) -> Option<Window> {
        // SAFETY: not inside a burst or a free (the shim checks too); the
        // drop closes the window.
        (unsafe { sys::emx_quiesce_begin(wait_ms) } == 0).then_some(Window)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the window this opened.
        unsafe { sys::emx_quiesce_end() };
    }
}

/// Dropped pools waiting for mbufs other than those closed ports' drivers
/// keep for good (see [`Mempool::kept_by_driver`]).
pub(crate) fn waiting_unexplained() -> usize {
    retired().iter().filter(|p| p.unexplained()).count()
}

/// Whether a dropped pool that is not freed yet has `name`.
fn name_waiting(name: &str) -> bool {
    retired().iter().any(|p| p.name == name)
}
