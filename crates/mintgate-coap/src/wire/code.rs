//! Message types and codes.

use std::fmt;

/// The 2-bit message type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageType {
    /// Confirmable: acknowledged, retransmitted until then.
    Con = 0,
    /// Non-confirmable.
    Non = 1,
    /// Acknowledgement.
    Ack = 2,
    /// Reset.
    Rst = 3,
}

impl MessageType {
    /// From the two header bits.
    pub fn from_bits(b: u8) -> MessageType {
        match b & 3 {
            0 => MessageType::Con,
            1 => MessageType::Non,
            2 => MessageType::Ack,
            _ => MessageType::Rst,
        }
    }

    /// Short upper-case name.
    pub fn name(self) -> &'static str {
        match self {
            MessageType::Con => "CON",
            MessageType::Non => "NON",
            MessageType::Ack => "ACK",
            MessageType::Rst => "RST",
        }
    }
}

/// A message code `c.dd`: 3-bit class, 5-bit detail.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Code(pub u8);

impl Code {
    /// 0.00, the code of an empty message.
    pub const EMPTY: Code = Code(0x00);
    /// 0.01 GET
    pub const GET: Code = Code::new(0, 1);
    /// 0.02 POST
    pub const POST: Code = Code::new(0, 2);
    /// 0.03 PUT
    pub const PUT: Code = Code::new(0, 3);
    /// 0.04 DELETE
    pub const DELETE: Code = Code::new(0, 4);
    /// 0.05 FETCH (RFC 8132)
    pub const FETCH: Code = Code::new(0, 5);
    /// 0.06 PATCH (RFC 8132)
    pub const PATCH: Code = Code::new(0, 6);
    /// 0.07 iPATCH (RFC 8132)
    pub const IPATCH: Code = Code::new(0, 7);
    /// 2.01 Created
    pub const CREATED: Code = Code::new(2, 1);
    /// 2.02 Deleted
    pub const DELETED: Code = Code::new(2, 2);
    /// 2.03 Valid
    pub const VALID: Code = Code::new(2, 3);
    /// 2.04 Changed
    pub const CHANGED: Code = Code::new(2, 4);
    /// 2.05 Content
    pub const CONTENT: Code = Code::new(2, 5);
    /// 2.31 Continue (RFC 7959)
    pub const CONTINUE: Code = Code::new(2, 31);
    /// 4.00 Bad Request
    pub const BAD_REQUEST: Code = Code::new(4, 0);
    /// 4.01 Unauthorized
    pub const UNAUTHORIZED: Code = Code::new(4, 1);
    /// 4.02 Bad Option
    pub const BAD_OPTION: Code = Code::new(4, 2);
    /// 4.03 Forbidden
    pub const FORBIDDEN: Code = Code::new(4, 3);
    /// 4.04 Not Found
    pub const NOT_FOUND: Code = Code::new(4, 4);
    /// 4.05 Method Not Allowed
    pub const METHOD_NOT_ALLOWED: Code = Code::new(4, 5);
    /// 4.06 Not Acceptable
    pub const NOT_ACCEPTABLE: Code = Code::new(4, 6);
    /// 4.08 Request Entity Incomplete (RFC 7959)
    pub const REQUEST_ENTITY_INCOMPLETE: Code = Code::new(4, 8);
    /// 4.12 Precondition Failed
    pub const PRECONDITION_FAILED: Code = Code::new(4, 12);
    /// 4.13 Request Entity Too Large
    pub const REQUEST_ENTITY_TOO_LARGE: Code = Code::new(4, 13);
    /// 4.15 Unsupported Content-Format
    pub const UNSUPPORTED_CONTENT_FORMAT: Code = Code::new(4, 15);
    /// 5.00 Internal Server Error
    pub const INTERNAL_SERVER_ERROR: Code = Code::new(5, 0);
    /// 5.01 Not Implemented
    pub const NOT_IMPLEMENTED: Code = Code::new(5, 1);
    /// 5.02 Bad Gateway
    pub const BAD_GATEWAY: Code = Code::new(5, 2);
    /// 5.03 Service Unavailable
    pub const SERVICE_UNAVAILABLE: Code = Code::new(5, 3);
    /// 5.04 Gateway Timeout
    pub const GATEWAY_TIMEOUT: Code = Code::new(5, 4);
    /// 5.05 Proxying Not Supported
    pub const PROXYING_NOT_SUPPORTED: Code = Code::new(5, 5);

    /// `class.detail`.
    pub const fn new(class: u8, detail: u8) -> Code {
        Code((class << 5) | (detail & 0x1f))
    }

    /// The class (0 request, 2 success, 4 client error, 5 server error).
    pub const fn class(self) -> u8 {
        self.0 >> 5
    }

    /// The detail.
    pub const fn detail(self) -> u8 {
        self.0 & 0x1f
    }

    /// 0.00.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// A request method code (0.01-0.31).
    pub const fn is_request(self) -> bool {
        self.class() == 0 && self.0 != 0
    }

    /// A response code (class 2, 4 or 5).
    pub const fn is_response(self) -> bool {
        matches!(self.class(), 2 | 4 | 5)
    }

    /// Classes other than 0, 2, 4 and 5 are reserved (RFC 7252 3).
    pub const fn is_reserved(self) -> bool {
        matches!(self.class(), 1 | 3 | 6 | 7)
    }

    /// The method or response name, where it has one.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Code::EMPTY => "Empty",
            Code::GET => "GET",
            Code::POST => "POST",
            Code::PUT => "PUT",
            Code::DELETE => "DELETE",
            Code::FETCH => "FETCH",
            Code::PATCH => "PATCH",
            Code::IPATCH => "iPATCH",
            Code::CREATED => "Created",
            Code::DELETED => "Deleted",
            Code::VALID => "Valid",
            Code::CHANGED => "Changed",
            Code::CONTENT => "Content",
            Code::CONTINUE => "Continue",
            Code::BAD_REQUEST => "Bad Request",
            Code::UNAUTHORIZED => "Unauthorized",
            Code::BAD_OPTION => "Bad Option",
            Code::FORBIDDEN => "Forbidden",
            Code::NOT_FOUND => "Not Found",
            Code::METHOD_NOT_ALLOWED => "Method Not Allowed",
            Code::NOT_ACCEPTABLE => "Not Acceptable",
            Code::REQUEST_ENTITY_INCOMPLETE => "Request Entity Incomplete",
            Code::PRECONDITION_FAILED => "Precondition Failed",
            Code::REQUEST_ENTITY_TOO_LARGE => "Request Entity Too Large",
            Code::UNSUPPORTED_CONTENT_FORMAT => "Unsupported Content-Format",
            Code::INTERNAL_SERVER_ERROR => "Internal Server Error",
            Code::NOT_IMPLEMENTED => "Not Implemented",
            Code::BAD_GATEWAY => "Bad Gateway",
            Code::SERVICE_UNAVAILABLE => "Service Unavailable",
            Code::GATEWAY_TIMEOUT => "Gateway Timeout",
            Code::PROXYING_NOT_SUPPORTED => "Proxying Not Supported",
            _ => return None,
        })
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:02}", self.class(), self.detail())?;
        if let Some(n) = self.name() {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
