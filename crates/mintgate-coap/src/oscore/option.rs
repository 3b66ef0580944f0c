//! The OSCORE option's value (RFC 8613 6.1): a flag byte, the Partial IV,
//! the kid context with its length, and the kid in the remaining bytes;
//! an empty value when all flags are zero.

use super::Error;

/// The decoded value of an OSCORE option.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OscoreOption<'a> {
    /// The Partial IV (1 to 5 bytes), if present.
    pub partial_iv: Option<&'a [u8]>,
    /// The kid context, if present.
    pub kid_context: Option<&'a [u8]>,
    /// The kid, if present (possibly empty).
    pub kid: Option<&'a [u8]>,
}

const FLAG_K: u8 = 0x08;
const FLAG_H: u8 = 0x10;
const N_MASK: u8 = 0x07;
const RESERVED: u8 = 0xe0;

impl<'a> OscoreOption<'a> {
    /// Decodes an option value; any reserved bit or length that does not add
    /// up is an error (answered 4.02 Bad Option, RFC 8613 8.2).
    pub fn decode(v: &'a [u8]) -> Result<OscoreOption<'a>, Error> {
        let Some((&flags, mut rest)) = v.split_first() else {
            return Ok(OscoreOption::default());
        };
        if flags & RESERVED != 0 {
            return Err(Error::BadOption);
        }
        let n = (flags & N_MASK) as usize;
        if n > 5 {
            return Err(Error::BadOption);
        }
        let mut o = OscoreOption::default();
        if n > 0 {
            if rest.len() < n {
                return Err(Error::BadOption);
            }
            o.partial_iv = Some(&rest[..n]);
            rest = &rest[n..];
        }
        if flags & FLAG_H != 0 {
            let (&s, r) = rest.split_first().ok_or(Error::BadOption)?;
            let s = s as usize;
            if r.len() < s {
                return Err(Error::BadOption);
            }
            o.kid_context = Some(&r[..s]);
            rest = &r[s..];
        }
        if flags & FLAG_K != 0 {
            o.kid = Some(rest);
        } else if !rest.is_empty() {
            return Err(Error::BadOption);
        }
        Ok(o)
    }

    /// Appends the encoded value to `out` (nothing when no field is present).
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let piv = self.partial_iv.unwrap_or(&[]);
        if piv.len() > 5 || self.kid_context.is_some_and(|c| c.len() > 255) {
            return Err(Error::BadOption);
        }
        let mut flags = piv.len() as u8;
        if self.kid.is_some() {
            flags |= FLAG_K;
        }
        if self.kid_context.is_some() {
            flags |= FLAG_H;
        }
        if flags == 0 {
            return Ok(());
        }
        out.push(flags);
        out.extend_from_slice(piv);
        if let Some(c) = self.kid_context {
            out.push(c.len() as u8);
            out.extend_from_slice(c);
        }
        if let Some(k) = self.kid {
            out.extend_from_slice(k);
        }
        Ok(())
    }
}
