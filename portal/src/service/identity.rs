//! Signing in with campus SSO: users keyed by (issuer, subject), and memberships kept in
//! step with the groups the provider sends.
//!
//! Memberships granted by group rules (`source = 'sso'`) are refreshed at every login:
//! added, changed, or removed when the group is gone. Memberships a lab admin granted
//! by hand (`source = 'manual'`) are never touched by a login.

use crate::db::models::User;
use crate::db::{self, users as accounts, DbConn};
use crate::domain::MembershipSource;
use crate::error::AppError;
use crate::identity::{grants, GroupRules, Identity};

/// A username for a new SSO user: the provider's, made safe, made unique.
fn free_username(c: &mut DbConn, wanted: &str) -> Result<String, AppError> {
    let base: String = wanted
        .chars()
        .filter(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(*ch))
        .take(56)
        .collect();
    let base = if base.is_empty() {
        "user".to_string()
    } else {
        base
    };
    let mut n = 1u64;
    loop {
        let candidate = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        if accounts::user_by_name(c, &candidate)?.is_none() {
            return Ok(candidate);
        }
        n += 1;
    }
}

/// Finds or creates the user for `id`, refreshes profile, operator flag and group
/// memberships; returns the user.
pub fn sign_in(c: &mut DbConn, id: &Identity, rules: &GroupRules) -> Result<User, AppError> {
    db::transaction(c, |c| {
        let existing = accounts::user_by_identity(c, &id.issuer, &id.subject)?;
        let user_id = match existing {
            Some(u) => u.id,
            None => {
                // An account the operators made by hand for the same person (same name and
                // e-mail, no identity yet) is linked rather than duplicated.
                let manual = accounts::user_by_name(c, &id.username)?.filter(|u| {
                    u.oidc_issuer.is_none()
                        && !id.email.is_empty()
                        && u.email.eq_ignore_ascii_case(&id.email)
                });
                match manual {
                    Some(u) => u.id,
                    None => {
                        let name = free_username(c, &id.username)?;
                        accounts::insert_sso_user(c, &name, &id.email, &id.name)?
                    }
                }
            }
        };
        let user = accounts::user_by_id(c, user_id)?;
        let granted = grants(rules, &id.groups);
        accounts::set_identity(c, user_id, id, user.operator_manual || granted.operator)?;

        let current = accounts::memberships_of(c, user_id)?;
        let mut wanted_labs = Vec::new();
        for (slug, role) in &granted.labs {
            let lab = match accounts::lab_by_slug(c, slug) {
                Ok(l) => l,
                Err(_) => accounts::create_lab(c, slug, slug)?,
            };
            wanted_labs.push(lab.id);
            match current.iter().find(|m| m.lab_id == lab.id) {
                Some(m) if m.source == MembershipSource::Manual => {}
                Some(m) if m.role == *role => {}
                _ => accounts::upsert_membership(c, user_id, lab.id, *role, MembershipSource::Sso)?,
            }
        }
        for m in &current {
            if m.source == MembershipSource::Sso && !wanted_labs.contains(&m.lab_id) {
                accounts::remove_membership(c, user_id, m.lab_id)?;
            }
        }
        accounts::user_by_id(c, user_id)
    })
}
