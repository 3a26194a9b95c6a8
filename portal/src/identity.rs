//! Who a campus SSO login says someone is ([`Identity`]), and how their groups map to
//! lab memberships and roles ([`GroupRules`], pure). Domain types: the OIDC client makes
//! identities, the database layer stores them, neither imports the other.
//!
//! Two kinds of rule, both in the `[oidc]` configuration:
//! - a naming convention: with `lab_group_prefix = "lab-"` and
//!   `lab_admin_suffix = "-admins"`, group `lab-vision` makes its members members of lab
//!   `vision`, and `lab-vision-admins` its admins; `operator_group` makes operators;
//! - explicit rules: `[[oidc.group_rules]] group = "cs-ml-staff", lab = "ml", role = "admin"`.
//!
//! When several rules name the same lab, admin wins over member.

pub use crate::domain::Identity;
use crate::domain::Role;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupRule {
    /// The group as the provider names it.
    pub group: String,
    /// The lab (slug) the group grants; created if missing.
    #[serde(default)]
    pub lab: Option<String>,
    /// `member` (default) or `admin`.
    #[serde(default)]
    pub role: Option<String>,
    /// The group makes operators.
    #[serde(default)]
    pub operator: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupRules {
    /// Groups named `<prefix><lab>` grant membership of `<lab>`.
    pub lab_group_prefix: Option<String>,
    /// ... and `<prefix><lab><suffix>` the lab's admin role.
    pub lab_admin_suffix: Option<String>,
    /// Members of this group are operators.
    pub operator_group: Option<String>,
    pub group_rules: Vec<GroupRule>,
}

/// What a set of groups grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// Lab slug -> role.
    pub labs: BTreeMap<String, Role>,
    pub operator: bool,
}

fn grant(labs: &mut BTreeMap<String, Role>, slug: &str, role: Role) {
    if crate::validate::slug("lab", slug).is_err() {
        return; // a group that cannot name a lab grants nothing
    }
    let e = labs.entry(slug.to_string()).or_insert(role);
    if role == Role::Admin {
        *e = Role::Admin;
    }
}

pub fn grants(rules: &GroupRules, groups: &[String]) -> Grants {
    let mut g = Grants::default();
    for group in groups {
        if rules.operator_group.as_deref() == Some(group.as_str()) {
            g.operator = true;
        }
        if let Some(prefix) = rules.lab_group_prefix.as_deref() {
            if let Some(rest) = group.strip_prefix(prefix) {
                match rules
                    .lab_admin_suffix
                    .as_deref()
                    .and_then(|s| rest.strip_suffix(s))
                {
                    Some(lab) => grant(&mut g.labs, lab, Role::Admin),
                    None => grant(&mut g.labs, rest, Role::Member),
                }
            }
        }
        for r in rules.group_rules.iter().filter(|r| &r.group == group) {
            g.operator |= r.operator;
            if let Some(lab) = &r.lab {
                let role = match r.role.as_deref() {
                    Some("admin") => Role::Admin,
                    _ => Role::Member,
                };
                grant(&mut g.labs, lab, role);
            }
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> GroupRules {
        GroupRules {
            lab_group_prefix: Some("lab-".into()),
            lab_admin_suffix: Some("-admins".into()),
            operator_group: Some("gpu-operators".into()),
            group_rules: vec![GroupRule {
                group: "cs-ml-staff".into(),
                lab: Some("ml".into()),
                role: Some("admin".into()),
                operator: false,
            }],
        }
    }

    fn g(groups: &[&str]) -> Grants {
        grants(
            &rules(),
            &groups.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    }

    #[test]
    fn naming_convention_and_explicit_rules() {
        let out = g(&["lab-vision", "lab-nlp-admins", "cs-ml-staff", "students"]);
        assert_eq!(out.labs["vision"], Role::Member);
        assert_eq!(out.labs["nlp"], Role::Admin);
        assert_eq!(out.labs["ml"], Role::Admin);
        assert_eq!(out.labs.len(), 3);
        assert!(!out.operator);
        assert!(g(&["gpu-operators"]).operator);
    }

    #[test]
    fn admin_wins_and_bad_names_grant_nothing() {
        let out = g(&["lab-vision-admins", "lab-vision"]);
        assert_eq!(out.labs["vision"], Role::Admin);
        assert!(g(&["lab-Bad Name", "lab-"]).labs.is_empty());
    }
}
