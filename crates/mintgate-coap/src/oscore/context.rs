//! The security context (RFC 8613 3): key derivation with HKDF-SHA-256
//! (3.2.1), the nonce (5.2) and AES-CCM-16-64-128 (COSE algorithm 10).

use aes::Aes128;
use ccm::aead::generic_array::GenericArray;
use ccm::aead::{AeadInPlace, KeyInit};
use ccm::consts::{U13, U8};
use hkdf::Hkdf;
use sha2::Sha256;

use super::cbor;
use super::Error;

/// COSE algorithm identifier of AES-CCM-16-64-128.
pub const AES_CCM_16_64_128: u8 = 10;
/// Key length of the algorithm.
pub const KEY_LEN: usize = 16;
/// Nonce length of the algorithm (also the Common IV's).
pub const NONCE_LEN: usize = 13;
/// Authentication tag length.
pub const TAG_LEN: usize = 8;
/// Longest Sender or Recipient ID: nonce length minus 6 (RFC 8613 3.3).
pub const MAX_ID_LEN: usize = NONCE_LEN - 6;
/// Longest ID Context accepted (the option carries its length in one byte).
pub const MAX_ID_CONTEXT_LEN: usize = 255;
/// Largest sender sequence number: Partial IVs are at most 5 bytes (2^40 - 1).
pub const MAX_SEQ: u64 = (1 << 40) - 1;

type Aead = ccm::Ccm<Aes128, U8, U13>;

/// What a context is made from (RFC 8613 3.2); AEAD and HKDF are fixed to
/// AES-CCM-16-64-128 and HKDF-SHA-256, the defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// The Master Secret (at least 16 bytes recommended; at least 1 required).
    pub master_secret: Vec<u8>,
    /// The Master Salt (empty by default).
    pub master_salt: Vec<u8>,
    /// This endpoint's Sender ID.
    pub sender_id: Vec<u8>,
    /// The peer's Sender ID.
    pub recipient_id: Vec<u8>,
    /// The ID Context, if any.
    pub id_context: Option<Vec<u8>>,
}

impl Params {
    /// Checks the lengths RFC 8613 3.3 allows.
    pub fn validate(&self) -> Result<(), Error> {
        if self.master_secret.is_empty() {
            return Err(Error::Config("the master secret is empty"));
        }
        if self.sender_id.len() > MAX_ID_LEN || self.recipient_id.len() > MAX_ID_LEN {
            return Err(Error::Config(
                "a sender or recipient ID is longer than 7 bytes",
            ));
        }
        if self.sender_id == self.recipient_id {
            return Err(Error::Config("sender and recipient IDs are the same"));
        }
        if self
            .id_context
            .as_ref()
            .is_some_and(|c| c.len() > MAX_ID_CONTEXT_LEN)
        {
            return Err(Error::Config("the ID context is longer than 255 bytes"));
        }
        Ok(())
    }
}

/// The derived keys and Common IV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    /// The Sender Key.
    pub sender_key: [u8; KEY_LEN],
    /// The Recipient Key.
    pub recipient_key: [u8; KEY_LEN],
    /// The Common IV.
    pub common_iv: [u8; NONCE_LEN],
}

/// The HKDF `info` of RFC 8613 3.2.1:
/// `[id, id_context / nil, alg_aead, type, L]`.
pub fn info(id: &[u8], id_context: Option<&[u8]>, ty: &str, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + id.len() + id_context.map_or(0, |c| c.len()));
    out.push(0x85);
    cbor::bstr(&mut out, id);
    match id_context {
        Some(c) => cbor::bstr(&mut out, c),
        None => out.push(cbor::NULL),
    }
    cbor::uint(&mut out, AES_CCM_16_64_128 as u64);
    cbor::tstr(&mut out, ty);
    cbor::uint(&mut out, len as u64);
    out
}

fn expand(hk: &Hkdf<Sha256>, info: &[u8], out: &mut [u8]) -> Result<(), Error> {
    hk.expand(info, out)
        .map_err(|_| Error::Config("HKDF output too long"))
}

/// Derives the keys and Common IV (RFC 8613 3.2.1).
pub fn derive(p: &Params) -> Result<Derived, Error> {
    p.validate()?;
    let hk = Hkdf::<Sha256>::new(Some(&p.master_salt), &p.master_secret);
    let ctx = p.id_context.as_deref();
    let mut d = Derived {
        sender_key: [0; KEY_LEN],
        recipient_key: [0; KEY_LEN],
        common_iv: [0; NONCE_LEN],
    };
    expand(
        &hk,
        &info(&p.sender_id, ctx, "Key", KEY_LEN),
        &mut d.sender_key,
    )?;
    expand(
        &hk,
        &info(&p.recipient_id, ctx, "Key", KEY_LEN),
        &mut d.recipient_key,
    )?;
    expand(&hk, &info(&[], ctx, "IV", NONCE_LEN), &mut d.common_iv)?;
    Ok(d)
}

/// The AEAD nonce of RFC 8613 5.2: the ID's length, the ID left-padded to
/// `nonce length - 6` bytes and the Partial IV left-padded to 5 bytes,
/// XORed with the Common IV.
pub fn nonce(common_iv: &[u8; NONCE_LEN], id: &[u8], piv: &[u8]) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    let id = &id[..id.len().min(MAX_ID_LEN)];
    let piv = &piv[..piv.len().min(5)];
    n[0] = id.len() as u8;
    n[1 + MAX_ID_LEN - id.len()..1 + MAX_ID_LEN].copy_from_slice(id);
    n[NONCE_LEN - piv.len()..].copy_from_slice(piv);
    for (b, iv) in n.iter_mut().zip(common_iv) {
        *b ^= iv;
    }
    n
}

/// A sequence number as a Partial IV: big-endian, leading zeros dropped,
/// 0 as one zero byte (RFC 8613 6.1). Returns the buffer and the length used.
pub fn partial_iv(seq: u64) -> ([u8; 5], usize) {
    let b = seq.to_be_bytes();
    let skip = ((seq.leading_zeros() / 8) as usize).min(7);
    let mut out = [0u8; 5];
    let len = (8 - skip).min(5);
    out[..len].copy_from_slice(&b[8 - len..]);
    (out, len)
}

/// A Partial IV as a number (`None` when longer than 5 bytes).
pub fn piv_value(piv: &[u8]) -> Option<u64> {
    (piv.len() <= 5).then(|| piv.iter().fold(0u64, |a, b| (a << 8) | *b as u64))
}

/// One direction's AEAD key, scheduled once.
#[derive(Clone)]
pub struct Key(Aead);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// A key from its bytes.
    pub fn new(k: &[u8; KEY_LEN]) -> Key {
        Key(Aead::new(GenericArray::from_slice(k)))
    }

    /// Encrypts `buf` in place and appends the tag.
    pub fn seal(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(), Error> {
        self.0
            .encrypt_in_place(GenericArray::from_slice(nonce), aad, buf)
            .map_err(|_| Error::TooLarge)
    }

    /// Checks the tag and decrypts `buf` in place (the tag is removed).
    pub fn open(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<(), Error> {
        if buf.len() < TAG_LEN {
            return Err(Error::Decrypt);
        }
        self.0
            .decrypt_in_place(GenericArray::from_slice(nonce), aad, buf)
            .map_err(|_| Error::Decrypt)
    }
}
