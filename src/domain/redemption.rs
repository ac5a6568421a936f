//! A redemption by amount: spend `quantity` of an owner's active tokens of one type at
//! once, named by the client's `reference`.

use super::{AccountId, Actor, Owner, Quantity, RedemptionReference, TokenType};

/// A validated `POST /v1/redemptions`.
#[derive(Debug, Clone)]
pub struct NewRedemption {
    pub owner: Owner,
    pub token_type: TokenType,
    pub quantity: Quantity,
    pub reference: RedemptionReference,
    /// Spend only tokens of this account (else of any account the key may see).
    pub account_id: Option<AccountId>,
    pub requested_by: Actor,
}
