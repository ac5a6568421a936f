//! The owner of a token: a MongoDB ObjectId, given as 24 hex characters.

use std::fmt;

use mongodb::bson::oid::ObjectId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner(ObjectId);

impl Owner {
    pub const RULE: &'static str = "must be a 24-character hex ObjectId";

    pub fn parse(value: &str) -> Result<Self, String> {
        // ObjectId::parse_str accepts only 24 hex digits, nothing else.
        ObjectId::parse_str(value)
            .map(Self)
            .map_err(|_| Self::RULE.to_owned())
    }

    pub fn from_object_id(id: ObjectId) -> Self {
        Self(id)
    }

    pub fn object_id(&self) -> ObjectId {
        self.0
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hex_only() {
        assert!(Owner::parse("65f1a0c2b3d4e5f601234567").is_ok());
        for bad in [
            "",
            "65f1a0c2b3d4e5f60123456",
            "65f1a0c2b3d4e5f6012345678",
            "zzf1a0c2b3d4e5f601234567",
        ] {
            assert!(Owner::parse(bad).is_err(), "{bad}");
        }
    }
}
