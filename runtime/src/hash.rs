//! FNV-1a (<http://www.isthe.com/chongo/tech/comp/fnv/>): a stable, non-cryptographic hash for
//! names that must not change across releases (std's hasher may), e.g. shortened object names,
//! socket names and the emulated GPUs' UUIDs.

/// 64-bit FNV offset basis.
pub const FNV64_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV64_PRIME: u64 = 0x0000_0100_0000_01b3;
/// 32-bit FNV offset basis.
pub const FNV32_OFFSET: u32 = 0x811c_9dc5;
const FNV32_PRIME: u32 = 0x0100_0193;

/// 64-bit FNV-1a of `data`, continuing from `seed` ([`FNV64_OFFSET`] for a fresh hash).
pub fn fnv1a64_from(seed: u64, data: &[u8]) -> u64 {
    data.iter()
        .fold(seed, |h, b| (h ^ u64::from(*b)).wrapping_mul(FNV64_PRIME))
}

/// 64-bit FNV-1a of `data`.
pub fn fnv1a64(data: &[u8]) -> u64 {
    fnv1a64_from(FNV64_OFFSET, data)
}

/// 32-bit FNV-1a of `data`.
pub fn fnv1a32(data: &[u8]) -> u32 {
    data.iter().fold(FNV32_OFFSET, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(FNV32_PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // Test vectors from the FNV reference page.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a64_from(fnv1a64(b"a"), b"b"), fnv1a64(b"ab"));
    }
}
