//! The few CBOR items (RFC 8949) OSCORE's fixed structures need: heads of
//! unsigned integers, byte strings and text strings, and `null`. The
//! structures themselves (HKDF info, external AAD, Enc_structure) are
//! checked byte for byte against RFC 8613 Appendix C in the tests.

/// CBOR `null`.
pub const NULL: u8 = 0xf6;

fn head(out: &mut Vec<u8>, major: u8, v: u64) {
    let m = major << 5;
    if v < 24 {
        out.push(m | v as u8);
    } else if v <= 0xff {
        out.extend_from_slice(&[m | 24, v as u8]);
    } else if v <= 0xffff {
        out.push(m | 25);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= 0xffff_ffff {
        out.push(m | 26);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// An unsigned integer.
pub fn uint(out: &mut Vec<u8>, v: u64) {
    head(out, 0, v);
}

/// A byte string.
pub fn bstr(out: &mut Vec<u8>, b: &[u8]) {
    head(out, 2, b.len() as u64);
    out.extend_from_slice(b);
}

/// A text string.
pub fn tstr(out: &mut Vec<u8>, s: &str) {
    head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_as_rfc_8949_appendix_a() {
        let enc = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut v = Vec::new();
            f(&mut v);
            v
        };
        assert_eq!(enc(&|o| uint(o, 10)), [0x0a]);
        assert_eq!(enc(&|o| uint(o, 24)), [0x18, 0x18]);
        assert_eq!(enc(&|o| uint(o, 1000)), [0x19, 0x03, 0xe8]);
        assert_eq!(enc(&|o| uint(o, 1_000_000)), [0x1a, 0x00, 0x0f, 0x42, 0x40]);
        assert_eq!(enc(&|o| bstr(o, &[1, 2, 3, 4])), [0x44, 1, 2, 3, 4]);
        assert_eq!(enc(&|o| tstr(o, "IETF")), [0x64, 0x49, 0x45, 0x54, 0x46]);
        let long = [7u8; 30];
        assert_eq!(enc(&|o| bstr(o, &long))[..2], [0x58, 30]);
    }
}
