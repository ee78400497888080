//! The tile registers: their configuration, the guard that holds them and the multiply loop.

use super::GROUP_COLS;

/// Tile configuration: palette 1, tiles 0-7 of 16 rows x 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes per row (u16, little-endian)
        c[48 + t] = 16; // rows
        t += 1;
    }
    TileConfig(c)
};

/// The four products of one step: accumulators 0-3 += A halves (tiles 4, 5) x B tiles (6, 7).
macro_rules! products {
    () => {
        "tdpbf16ps tmm0, tmm4, tmm6\ntdpbf16ps tmm1, tmm4, tmm7\ntdpbf16ps tmm2, tmm5, tmm6\ntdpbf16ps tmm3, tmm5, tmm7"
    };
}

/// The loop over `$count` chunks: load the A halves (tiles 4, 5) and the high or only B tiles
/// (6, 7), add their products, run `$more` (the other parts' loads and products, for f16),
/// then step A by `$a_step` and each B by `$b_step` bytes.
macro_rules! chunk_loop {
    ($a:ident, $b0:ident, $b1:ident, $count:ident, $a_step:literal, $b_step:literal, $($more:tt)*) => {
        core::arch::asm!(
            "2:",
            "tileloadd tmm4, [{a} + {s64}*1]",
            "tileloadd tmm5, [{a} + {s64}*1 + 1024]",
            "tileloadd tmm6, [{b0} + {s64}*1]",
            "tileloadd tmm7, [{b1} + {s64}*1]",
            products!(),
            $($more)*
            concat!("add {a}, ", $a_step),
            concat!("add {b0}, ", $b_step),
            concat!("add {b1}, ", $b_step),
            "dec {n}",
            "jnz 2b",
            a = inout(reg) $a => _,
            b0 = inout(reg) $b0 => _,
            b1 = inout(reg) $b1 => _,
            n = inout(reg) $count => _,
            s64 = in(reg) 64usize,
            options(nostack, readonly),
        )
    };
}

/// The tile registers configured on this thread (16 rows x 64 bytes each); released on drop.
/// Only this module's `asm!` touches tile registers, so their contents last from one
/// [`Tiles::multiply`] to the next.
pub(super) struct Tiles(());

impl Tiles {
    /// # Safety
    /// AMX is usable ([`amx_supported`](super::super::switch::amx_supported)).
    pub(super) unsafe fn configure() -> Tiles {
        static CFG: TileConfig = CONFIG;
        // SAFETY: AMX is usable (our contract); `ldtilecfg` reads the 64 bytes of `CFG`.
        unsafe { core::arch::asm!("ldtilecfg [{cfg}]", cfg = in(reg) &CFG, options(nostack, readonly)) };
        Tiles(())
    }

    /// `acc[0..32][0..32] (+)= A chunks x (B tiles b0 | B tiles b1)` over `count` chunks, where
    /// `acc` rows are `GROUP_COLS` f32 apart: tiles 0-3 accumulate (loaded from `acc` when
    /// `add`, else zero), 4-5 hold the panel's two halves, 6-7 the two B tiles.
    ///
    /// With `split`, each chunk and tile is two, the high and the low bf16 parts of f16 values,
    /// one after the other; all four products of parts are added (`(ah + al)(bh + bl)`, each
    /// product exact in f32), loading the parts in the order hh, hl, ll, lh so that each step
    /// reloads only two tiles.
    ///
    /// # Safety
    /// `a` holds `count` packed A chunks, `b0` / `b1` `count` packed B tiles each (twice as many
    /// with `split`); `acc` is valid for reads and writes of 32 rows of 32 f32, `GROUP_COLS` f32
    /// apart; `count >= 1`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn multiply(
        &self,
        a: *const u16,
        b0: *const u16,
        b1: *const u16,
        count: usize,
        acc: *mut f32,
        add: bool,
        split: bool,
    ) {
        const ROW: usize = GROUP_COLS * 4;
        debug_assert!(count >= 1);
        // SAFETY: (all `asm!` blocks) the tiles are configured (`self`). The loads read 16 rows
        // of 64 bytes per chunk (per part with `split`) from each of `a`, `a + 1024`, `b0` and
        // `b1`, which the packed layouts hold (rows 64 bytes apart; parts 2048 bytes apart in A,
        // 1024 in B); the accumulator loads and stores touch 16 rows of 64 bytes at `acc`,
        // `acc + 64`, `acc + 16 rows` and `acc + 16 rows + 64`: the 32 x 32 f32 the caller gives.
        unsafe {
            if add {
                core::arch::asm!(
                    "tileloadd tmm0, [{acc} + {row}*1]",
                    "tileloadd tmm1, [{acc} + {row}*1 + 64]",
                    "tileloadd tmm2, [{acc16} + {row}*1]",
                    "tileloadd tmm3, [{acc16} + {row}*1 + 64]",
                    acc = in(reg) acc,
                    acc16 = in(reg) acc.add(16 * GROUP_COLS),
                    row = in(reg) ROW,
                    options(nostack, readonly),
                );
            } else {
                core::arch::asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            }
            if split {
                chunk_loop!(
                    a,
                    b0,
                    b1,
                    count,
                    "4096",
                    "2048",
                    "tileloadd tmm6, [{b0} + {s64}*1 + 1024]",
                    "tileloadd tmm7, [{b1} + {s64}*1 + 1024]",
                    products!(),
                    "tileloadd tmm4, [{a} + {s64}*1 + 2048]",
                    "tileloadd tmm5, [{a} + {s64}*1 + 3072]",
                    products!(),
                    "tileloadd tmm6, [{b0} + {s64}*1]",
                    "tileloadd tmm7, [{b1} + {s64}*1]",
                    products!(),
                );
            } else {
                chunk_loop!(a, b0, b1, count, "2048", "1024",);
            }
            core::arch::asm!(
                "tilestored [{acc} + {row}*1], tmm0",
                "tilestored [{acc} + {row}*1 + 64], tmm1",
                "tilestored [{acc16} + {row}*1], tmm2",
                "tilestored [{acc16} + {row}*1 + 64], tmm3",
                acc = in(reg) acc,
                acc16 = in(reg) acc.add(16 * GROUP_COLS),
                row = in(reg) ROW,
                options(nostack),
            );
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: `tilerelease` returns the tile registers to their initial state; it has no
        // operands and touches no memory.
        unsafe { core::arch::asm!("tilerelease", options(nostack, nomem)) };
    }
}
