//! CPU helpers for fast paths that DPDK programs write with intrinsics:
//! copies that bypass the caches, and the fence that orders them; and the CPU
//! a thread runs on.

/// Copies `src` into `dst` with non-temporal (streaming) stores where the CPU
/// has them (x86_64): the whole 64-byte lines of `dst` are written around the
/// caches, without reading them first, and the partial lines at either end
/// (and copies shorter than two lines) with ordinary stores. Elsewhere it is
/// an ordinary copy.
///
/// It is for large destinations that will not be read soon, such as a
/// multi-megabyte receive buffer filled frame by frame: an ordinary copy
/// reads every destination line into the cache before overwriting it and
/// evicts data that is still wanted, while streaming stores send each line to
/// memory once.
///
/// # Panics
/// When `dst` and `src` differ in length.
///
/// # Safety
/// Streaming stores are weakly ordered. Other threads may not see them, even
/// after synchronising with this one (a release store does not order them),
/// until [`store_fence`] has run on this thread. The caller must call
/// `store_fence` before `dst` is read or written by any other thread or handed
/// to one, and before it is freed.
#[inline]
pub unsafe fn copy_streaming(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_streaming: lengths differ");
    #[cfg(target_arch = "x86_64")]
    {
        let n = dst.len();
        // Bytes up to the first line boundary of `dst`.
        let head = (dst.as_ptr() as usize).wrapping_neg() & 63;
        if n >= head + 128 {
            let lines = (n - head) / 64;
            let body = head + lines * 64;
            dst[..head].copy_from_slice(&src[..head]);
            let d = dst[head..body].as_mut_ptr();
            let s = src[head..body].as_ptr();
            // SAFETY: `d` and `s` hold `lines` 64-byte lines (the subslices
            // above), `d` is 64-byte aligned (`head` puts it on a line
            // boundary), and the slices cannot overlap (one is borrowed
            // mutably). The AVX loop runs only where the CPU has AVX; SSE2 is
            // part of x86_64.
            unsafe {
                if std::is_x86_feature_detected!("avx") {
                    stream_lines_avx(d, s, lines);
                } else {
                    stream_lines_sse2(d, s, lines);
                }
            }
            dst[body..].copy_from_slice(&src[body..]);
            return;
        }
    }
    dst.copy_from_slice(src);
}

/// Streams `lines` 64-byte lines from `s` to `d` with 16-byte SSE2 stores.
///
/// # Safety
/// `d` (64-byte aligned) and `s` hold `lines` lines and do not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_lines_sse2(d: *mut u8, s: *const u8, lines: usize) {
    use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let (d, s) = (d.cast::<__m128i>(), s.cast::<__m128i>());
    for i in 0..lines * 4 {
        // SAFETY: in bounds and aligned as the caller promises; unaligned
        // loads need no alignment.
        unsafe { _mm_stream_si128(d.add(i), _mm_loadu_si128(s.add(i))) };
    }
}

/// Streams `lines` 64-byte lines from `s` to `d` with 32-byte AVX stores: a
/// third faster than 16-byte ones for rendezvous data on the development
/// VM's EPYC (1 MiB one-way stream on a memif pair: 159-162 to 184-193
/// Gbit/s), and as fast as 64-byte AVX-512 ones.
///
/// # Safety
/// The CPU has AVX; `d` (64-byte aligned) and `s` hold `lines` lines and do
/// not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn stream_lines_avx(d: *mut u8, s: *const u8, lines: usize) {
    use core::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256};
    let (d, s) = (d.cast::<__m256i>(), s.cast::<__m256i>());
    for i in 0..lines * 2 {
        // SAFETY: in bounds and aligned as the caller promises; unaligned
        // loads need no alignment.
        unsafe { _mm256_stream_si256(d.add(i), _mm256_loadu_si256(s.add(i))) };
    }
}

/// Orders every earlier store of this thread, streaming stores included,
/// before every later one (`rte_wmb` on x86: `sfence`), so that data written
/// by [`copy_streaming`] is seen by a thread that synchronises with this one
/// afterwards.
#[inline]
pub fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `sfence` has no preconditions; it only orders stores.
    unsafe {
        core::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

/// The CPU this thread runs on now (`sched_getcpu(3)`, a vDSO call), or
/// `None` where the kernel does not say. The thread may move right after.
#[inline]
pub fn current_cpu() -> Option<usize> {
    // SAFETY: sched_getcpu takes nothing and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_cpu_is_one_this_thread_may_use() {
        let cpu = current_cpu().expect("sched_getcpu works on Linux");
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list")
            .trim();
        // "0-3,8,10-11"
        let allowed = list.split(',').any(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            (lo.parse().unwrap()..=hi.parse().unwrap()).contains(&cpu)
        });
        assert!(allowed, "CPU {cpu} not in {list}");
    }

    #[test]
    fn streaming_copy_equals_an_ordinary_one_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..1600u32).map(|i| (i * 7 + 3) as u8).collect();
        for at in [0usize, 1, 15, 16, 63, 64, 65] {
            for len in [0usize, 1, 63, 64, 127, 128, 129, 191, 700, 1460, 1600] {
                let mut dst = vec![0xAAu8; 1700];
                // SAFETY: the fence follows before the buffer is read.
                unsafe { copy_streaming(&mut dst[at..at + len], &src[..len]) };
                store_fence();
                assert_eq!(&dst[at..at + len], &src[..len], "at {at} len {len}");
                assert!(
                    dst[..at].iter().all(|&b| b == 0xAA),
                    "before, at {at} len {len}"
                );
                assert!(
                    dst[at + len..].iter().all(|&b| b == 0xAA),
                    "after, at {at} len {len}"
                );
            }
        }
    }

    /// Both line loops, whichever `copy_streaming` picks on this CPU.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn each_line_loop_copies_whole_lines_and_nothing_else() {
        let src: Vec<u8> = (0..6 * 64 + 5u32).map(|i| (i * 13 + 1) as u8).collect();
        for avx in [false, true] {
            if avx && !std::is_x86_feature_detected!("avx") {
                continue;
            }
            for lines in 0..=6usize {
                for from in [0usize, 5] {
                    let mut dst = vec![0x55u8; 8 * 64 + 64];
                    let at = (dst.as_ptr() as usize).wrapping_neg() & 63;
                    let (d, s) = (dst[at..].as_mut_ptr(), src[from..].as_ptr());
                    // SAFETY: `d` is line-aligned with room for 8 lines, `s`
                    // holds `lines` lines from `from`, AVX is checked above,
                    // and the fence follows before the buffer is read.
                    unsafe {
                        if avx {
                            stream_lines_avx(d, s, lines);
                        } else {
                            stream_lines_sse2(d, s, lines);
                        }
                    }
                    store_fence();
                    let n = lines * 64;
                    assert_eq!(
                        &dst[at..at + n],
                        &src[from..from + n],
                        "avx {avx} lines {lines}"
                    );
                    assert!(dst[..at].iter().chain(&dst[at + n..]).all(|&b| b == 0x55));
                }
            }
        }
    }
}
