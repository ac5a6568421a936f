//! A payment's state as the provider last reported it.

use serde::{Deserialize, Serialize};

/// The payment states tokenmint distinguishes. Their `rank` orders them for providers
/// without an object version (Stripe): a state never moves to a lower rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PaymentStatus {
    Processing,
    Failed,
    Succeeded,
    Canceled,
    Refunded,
}

impl PaymentStatus {
    /// processing and failed (a failed attempt can be retried) < succeeded and canceled
    /// (terminal for the attempt) < refunded.
    pub fn rank(self) -> i64 {
        match self {
            Self::Processing | Self::Failed => 1,
            Self::Succeeded | Self::Canceled => 2,
            Self::Refunded => 3,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Failed => "failed",
            Self::Succeeded => "succeeded",
            Self::Canceled => "canceled",
            Self::Refunded => "refunded",
        }
    }
}
