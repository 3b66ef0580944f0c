//! Options: numbers, their properties (RFC 7252 5.4, 5.10), the delta/length
//! encoding (3.1) and integer values (3.2).

/// An option number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OptionNumber(pub u16);

impl OptionNumber {
    /// If-Match (RFC 7252)
    pub const IF_MATCH: OptionNumber = OptionNumber(1);
    /// Uri-Host
    pub const URI_HOST: OptionNumber = OptionNumber(3);
    /// ETag
    pub const ETAG: OptionNumber = OptionNumber(4);
    /// If-None-Match
    pub const IF_NONE_MATCH: OptionNumber = OptionNumber(5);
    /// Observe (RFC 7641)
    pub const OBSERVE: OptionNumber = OptionNumber(6);
    /// Uri-Port
    pub const URI_PORT: OptionNumber = OptionNumber(7);
    /// Location-Path
    pub const LOCATION_PATH: OptionNumber = OptionNumber(8);
    /// Uri-Path
    pub const URI_PATH: OptionNumber = OptionNumber(11);
    /// Content-Format
    pub const CONTENT_FORMAT: OptionNumber = OptionNumber(12);
    /// Max-Age
    pub const MAX_AGE: OptionNumber = OptionNumber(14);
    /// Uri-Query
    pub const URI_QUERY: OptionNumber = OptionNumber(15);
    /// Accept
    pub const ACCEPT: OptionNumber = OptionNumber(17);
    /// Location-Query
    pub const LOCATION_QUERY: OptionNumber = OptionNumber(20);
    /// Block2 (RFC 7959)
    pub const BLOCK2: OptionNumber = OptionNumber(23);
    /// Block1 (RFC 7959)
    pub const BLOCK1: OptionNumber = OptionNumber(27);
    /// Size2 (RFC 7959)
    pub const SIZE2: OptionNumber = OptionNumber(28);
    /// Proxy-Uri
    pub const PROXY_URI: OptionNumber = OptionNumber(35);
    /// Proxy-Scheme
    pub const PROXY_SCHEME: OptionNumber = OptionNumber(39);
    /// Size1
    pub const SIZE1: OptionNumber = OptionNumber(60);
    /// Echo (RFC 9175 2): a server's freshness or reachability challenge,
    /// repeated by the client; elective, safe to forward, no cache key.
    pub const ECHO: OptionNumber = OptionNumber(252);
    /// No-Response (RFC 7967)
    pub const NO_RESPONSE: OptionNumber = OptionNumber(258);
    /// Request-Tag (RFC 9175 3): tells block-wise request bodies of one
    /// resource apart. Elective, safe to forward, part of the cache key,
    /// repeatable, opaque of 0-8 bytes.
    pub const REQUEST_TAG: OptionNumber = OptionNumber(292);
    /// mintgate's Access-Token (opaque, 1..=255 bytes): a credential for
    /// writes. From the experimental range (RFC 7252 12.2), elective (a
    /// server that does not know it ignores it) and unsafe to forward (a
    /// proxy that does not know it must not pass it on). Not in the
    /// registered definitions.
    pub const ACCESS_TOKEN: OptionNumber = OptionNumber(65002);

    /// Odd numbers are critical: an endpoint that does not understand one
    /// must reject the message.
    pub const fn is_critical(self) -> bool {
        self.0 & 1 == 1
    }

    /// Unsafe-to-forward for a proxy that does not understand it.
    pub const fn is_unsafe(self) -> bool {
        self.0 & 2 == 2
    }

    /// Not part of the cache key (only meaningful when safe to forward).
    pub const fn is_no_cache_key(self) -> bool {
        self.0 & 0x1e == 0x1c
    }

    /// The definition of a registered option this implementation knows.
    pub fn def(self) -> Option<&'static OptionDef> {
        DEFS.iter().find(|d| d.number == self)
    }
}

/// Value format of an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionFormat {
    /// Zero-length.
    Empty,
    /// Opaque bytes.
    Opaque,
    /// Unsigned integer in network byte order, leading zeros dropped.
    Uint,
    /// UTF-8 string.
    String,
}

/// A registered option: name, format, value length range, repeatability.
#[derive(Debug)]
pub struct OptionDef {
    /// Option number.
    pub number: OptionNumber,
    /// Registered name.
    pub name: &'static str,
    /// Value format.
    pub format: OptionFormat,
    /// Smallest valid value length.
    pub min_len: u16,
    /// Largest valid value length.
    pub max_len: u16,
    /// May occur more than once.
    pub repeatable: bool,
}

macro_rules! def {
    ($n:ident, $name:expr, $f:ident, $min:expr, $max:expr, $rep:expr) => {
        OptionDef {
            number: OptionNumber::$n,
            name: $name,
            format: OptionFormat::$f,
            min_len: $min,
            max_len: $max,
            repeatable: $rep,
        }
    };
}

/// RFC 7252 table 4, plus Observe, Block1/2, Size2, Echo, No-Response and
/// Request-Tag.
static DEFS: [OptionDef; 22] = [
    def!(IF_MATCH, "If-Match", Opaque, 0, 8, true),
    def!(URI_HOST, "Uri-Host", String, 1, 255, false),
    def!(ETAG, "ETag", Opaque, 1, 8, true),
    def!(IF_NONE_MATCH, "If-None-Match", Empty, 0, 0, false),
    def!(OBSERVE, "Observe", Uint, 0, 3, false),
    def!(URI_PORT, "Uri-Port", Uint, 0, 2, false),
    def!(LOCATION_PATH, "Location-Path", String, 0, 255, true),
    def!(URI_PATH, "Uri-Path", String, 0, 255, true),
    def!(CONTENT_FORMAT, "Content-Format", Uint, 0, 2, false),
    def!(MAX_AGE, "Max-Age", Uint, 0, 4, false),
    def!(URI_QUERY, "Uri-Query", String, 0, 255, true),
    def!(ACCEPT, "Accept", Uint, 0, 2, false),
    def!(LOCATION_QUERY, "Location-Query", String, 0, 255, true),
    def!(BLOCK2, "Block2", Uint, 0, 3, false),
    def!(BLOCK1, "Block1", Uint, 0, 3, false),
    def!(SIZE2, "Size2", Uint, 0, 4, false),
    def!(PROXY_URI, "Proxy-Uri", String, 1, 1034, false),
    def!(PROXY_SCHEME, "Proxy-Scheme", String, 1, 255, false),
    def!(SIZE1, "Size1", Uint, 0, 4, false),
    def!(ECHO, "Echo", Opaque, 1, 40, false),
    def!(NO_RESPONSE, "No-Response", Uint, 0, 1, false),
    def!(REQUEST_TAG, "Request-Tag", Opaque, 0, 8, true),
];

impl OptionDef {
    /// Every option this implementation knows.
    pub fn all() -> &'static [OptionDef] {
        &DEFS
    }

    /// Whether `len` is inside the registered value length range. Outside it,
    /// RFC 7252 5.4.3 says to treat the option as unrecognized.
    pub fn len_ok(&self, len: usize) -> bool {
        (self.min_len as usize..=self.max_len as usize).contains(&len)
    }
}

/// Well-known Content-Format identifiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentFormat(pub u16);

impl ContentFormat {
    /// text/plain;charset=utf-8
    pub const TEXT_PLAIN: ContentFormat = ContentFormat(0);
    /// application/link-format
    pub const LINK_FORMAT: ContentFormat = ContentFormat(40);
    /// application/xml
    pub const XML: ContentFormat = ContentFormat(41);
    /// application/octet-stream
    pub const OCTET_STREAM: ContentFormat = ContentFormat(42);
    /// application/exi
    pub const EXI: ContentFormat = ContentFormat(47);
    /// application/json
    pub const JSON: ContentFormat = ContentFormat(50);
    /// application/cbor
    pub const CBOR: ContentFormat = ContentFormat(60);
    /// application/senml+json
    pub const SENML_JSON: ContentFormat = ContentFormat(110);
    /// application/senml+cbor
    pub const SENML_CBOR: ContentFormat = ContentFormat(112);

    /// The program's one table of media types with a Content-Format (RFC
    /// 7252 section 12.3 and the CoRE registry's common entries): the
    /// CLI's `--format`, the gateway and the HTTP proxy's Content-Type
    /// mapping all read it.
    pub const NAMES: [(u16, &'static str); 9] = [
        (0, "text/plain;charset=utf-8"),
        (40, "application/link-format"),
        (41, "application/xml"),
        (42, "application/octet-stream"),
        (47, "application/exi"),
        (50, "application/json"),
        (60, "application/cbor"),
        (110, "application/senml+json"),
        (112, "application/senml+cbor"),
    ];

    /// The media type, where registered here.
    pub fn media_type(self) -> Option<&'static str> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == self.0)
            .map(|(_, m)| *m)
    }

    /// Parses a number or one of the media types (also short forms `text`,
    /// `json`, `cbor`, `link`, `octet`, `xml`).
    pub fn parse(s: &str) -> Option<ContentFormat> {
        if let Ok(n) = s.parse::<u16>() {
            return Some(ContentFormat(n));
        }
        let short = match s {
            "text" | "text/plain" => Some(0),
            "link" => Some(40),
            "xml" => Some(41),
            "octet" | "binary" => Some(42),
            "json" => Some(50),
            "cbor" => Some(60),
            _ => None,
        };
        short
            .or_else(|| Self::NAMES.iter().find(|(_, m)| *m == s).map(|(n, _)| *n))
            .map(ContentFormat)
    }
}

/// One option as found in a message: number and value, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawOption<'a> {
    /// The option number (running sum of deltas).
    pub number: OptionNumber,
    /// The value bytes.
    pub value: &'a [u8],
}

impl RawOption<'_> {
    /// The value as an unsigned integer (`None` when longer than 4 bytes).
    pub fn uint(&self) -> Option<u32> {
        decode_uint(self.value)
    }

    /// The value as UTF-8.
    pub fn str(&self) -> Option<&str> {
        std::str::from_utf8(self.value).ok()
    }
}

/// The first value of option `n` in `options` (number and value pairs).
pub(crate) fn first_option<V: AsRef<[u8]>>(
    options: &[(OptionNumber, V)],
    n: OptionNumber,
) -> Option<&[u8]> {
    options
        .iter()
        .find(|(o, _)| *o == n)
        .map(|(_, v)| v.as_ref())
}

/// Decodes a CoAP uint (0-4 bytes, big-endian, leading zeros allowed).
pub fn decode_uint(v: &[u8]) -> Option<u32> {
    if v.len() > 4 {
        return None;
    }
    Some(v.iter().fold(0u32, |a, b| (a << 8) | *b as u32))
}

/// Encodes `v` in the fewest bytes (0 has length 0) into `buf`, returning the
/// used tail of `buf`.
pub fn encode_uint(v: u32, buf: &mut [u8; 4]) -> &[u8] {
    *buf = v.to_be_bytes();
    let skip = (v.leading_zeros() / 8) as usize;
    &buf[skip..]
}

/// Reads the extended form of a delta or length nibble. `Err(())` on the
/// reserved nibble 15 or a truncated extension.
#[inline]
pub(crate) fn read_ext(nibble: u8, buf: &[u8], pos: &mut usize) -> Result<u32, ()> {
    match nibble {
        0..=12 => Ok(nibble as u32),
        13 => {
            let b = *buf.get(*pos).ok_or(())?;
            *pos += 1;
            Ok(b as u32 + 13)
        }
        14 => {
            let hi = *buf.get(*pos).ok_or(())?;
            let lo = *buf.get(*pos + 1).ok_or(())?;
            *pos += 2;
            Ok(u16::from_be_bytes([hi, lo]) as u32 + 269)
        }
        _ => Err(()),
    }
}

/// Iterator over a validated option region (see [`crate::wire::Packet`]).
/// Never fails: the region was walked once when the packet was checked.
#[derive(Clone, Debug)]
pub struct OptionIter<'a> {
    buf: &'a [u8],
    pos: usize,
    number: u32,
}

impl<'a> OptionIter<'a> {
    /// Iterates over `buf`, which must have passed the packet check.
    pub(crate) fn new(buf: &'a [u8]) -> OptionIter<'a> {
        OptionIter {
            buf,
            pos: 0,
            number: 0,
        }
    }
}

impl<'a> Iterator for OptionIter<'a> {
    type Item = RawOption<'a>;

    fn next(&mut self) -> Option<RawOption<'a>> {
        let b = *self.buf.get(self.pos)?;
        if b == crate::wire::PAYLOAD_MARKER {
            return None;
        }
        self.pos += 1;
        let delta = read_ext(b >> 4, self.buf, &mut self.pos).ok()?;
        let len = read_ext(b & 0x0f, self.buf, &mut self.pos).ok()? as usize;
        self.number += delta;
        let value = self.buf.get(self.pos..self.pos + len)?;
        self.pos += len;
        Some(RawOption {
            number: OptionNumber(self.number as u16),
            value,
        })
    }
}

/// Length of the delta/length extension for a value `v`.
#[inline]
pub(crate) fn ext_len(v: u32) -> usize {
    match v {
        0..=12 => 0,
        13..=268 => 1,
        _ => 2,
    }
}

/// Nibble for a value `v`.
#[inline]
pub(crate) fn nibble(v: u32) -> u8 {
    match v {
        0..=12 => v as u8,
        13..=268 => 13,
        _ => 14,
    }
}

/// Writes an extension for value `v` at `out[pos..]`, returning the new pos.
#[inline]
pub(crate) fn write_ext(v: u32, out: &mut [u8], pos: usize) -> usize {
    match v {
        0..=12 => pos,
        13..=268 => {
            out[pos] = (v - 13) as u8;
            pos + 1
        }
        _ => {
            out[pos..pos + 2].copy_from_slice(&((v - 269) as u16).to_be_bytes());
            pos + 2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_number_properties_match_rfc7252_table4() {
        assert!(OptionNumber::URI_PATH.is_critical());
        assert!(OptionNumber::URI_PATH.is_unsafe());
        assert!(!OptionNumber::ETAG.is_critical());
        assert!(OptionNumber::SIZE1.is_no_cache_key());
        assert!(OptionNumber::SIZE2.is_no_cache_key());
        assert!(!OptionNumber::ETAG.is_no_cache_key());
        assert!(OptionNumber::MAX_AGE.is_unsafe());
        assert_eq!(OptionNumber::PROXY_URI.def().unwrap().max_len, 1034);
        assert!(OptionNumber(9).def().is_none());
        // RFC 9175 3.2.1: Request-Tag is elective, safe to forward, part of
        // the cache key, repeatable, 0-8 bytes
        let rt = OptionNumber::REQUEST_TAG;
        assert!(!rt.is_critical() && !rt.is_unsafe() && !rt.is_no_cache_key());
        let d = rt.def().unwrap();
        assert_eq!(
            (d.name, d.min_len, d.max_len, d.repeatable),
            ("Request-Tag", 0, 8, true)
        );
    }

    #[test]
    fn uint_minimal_encoding() {
        let mut b = [0; 4];
        assert_eq!(encode_uint(0, &mut b), &[] as &[u8]);
        assert_eq!(encode_uint(1, &mut b), &[1]);
        assert_eq!(encode_uint(256, &mut b), &[1, 0]);
        assert_eq!(encode_uint(u32::MAX, &mut b), &[255; 4]);
        assert_eq!(decode_uint(&[0, 0, 1]), Some(1));
        assert_eq!(decode_uint(&[1, 2, 3, 4, 5]), None);
    }

    #[test]
    fn content_format_names() {
        assert_eq!(ContentFormat::parse("json"), Some(ContentFormat::JSON));
        assert_eq!(
            ContentFormat::parse("application/cbor"),
            Some(ContentFormat::CBOR)
        );
        assert_eq!(ContentFormat::parse("1234"), Some(ContentFormat(1234)));
        assert_eq!(
            ContentFormat::TEXT_PLAIN.media_type(),
            Some("text/plain;charset=utf-8")
        );
        assert_eq!(ContentFormat::parse("nope"), None);
    }
}
