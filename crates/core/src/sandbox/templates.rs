//! Which image a session's template names: the default one, or one of the admin's
//! `[[templates]]` (config/templates.rs), by the tag its backend built it under.
//!
//! The binary fills this in (crates/sandboxd/src/backends.rs: the Docker crate knows the
//! tags) and gives it to the session manager; every front end resolves a name through
//! `resolve_template` (serve's `/v1`, `run` and `exec`, later the E2B facade), so an unknown
//! name is the same error everywhere and never silently the default.

use std::collections::BTreeMap;

use super::SandboxError;
use crate::config::DEFAULT_TEMPLATE;

/// The templates sessions may name, with the image each is made from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Templates {
    /// The image of the default template (the runtime's own), when known.
    default: Option<String>,
    /// The admin's templates by name, each with its image.
    named: BTreeMap<String, String>,
}

/// A resolved template: its name, and the image to make the sandbox from (None: the
/// runtime's default image, which the warm pool serves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateImage {
    pub name: String,
    pub image: Option<String>,
}

impl Templates {
    /// `default` is the runtime's image (for messages and `resolve_template`'s answer);
    /// `named` the admin's templates with their images.
    pub fn new(default: Option<String>, named: BTreeMap<String, String>) -> Templates {
        Templates { default, named }
    }

    /// Every name a session may use, `default` first.
    pub fn names(&self) -> Vec<String> {
        std::iter::once(DEFAULT_TEMPLATE.to_string())
            .chain(self.named.keys().cloned())
            .collect()
    }

    /// The template `name` names (None, empty or `default`: the default one), or an error
    /// listing the known names.
    pub fn resolve(&self, name: Option<&str>) -> Result<TemplateImage, SandboxError> {
        let name = name.map(str::trim).filter(|n| !n.is_empty());
        match name {
            None | Some(DEFAULT_TEMPLATE) => Ok(TemplateImage {
                name: DEFAULT_TEMPLATE.into(),
                image: None,
            }),
            Some(n) => match self.named.get(n) {
                Some(image) => Ok(TemplateImage {
                    name: n.to_string(),
                    image: Some(image.clone()),
                }),
                None => Err(SandboxError::InvalidRequest(format!(
                    "no template {:?}; the templates are: {}",
                    n.chars().take(64).collect::<String>(),
                    self.names().join(", ")
                ))),
            },
        }
    }

    /// The image template `name` makes sessions from: what a front end that speaks in
    /// images (the E2B facade's `template`) asks. The default template answers with the
    /// runtime's image when it is known, else an empty string (the runtime picks).
    pub fn resolve_template(&self, name: &str) -> Result<String, SandboxError> {
        let t = self.resolve(Some(name))?;
        Ok(t.image.or_else(|| self.default.clone()).unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn templates() -> Templates {
        Templates::new(
            Some("img:default".into()),
            BTreeMap::from([("jq".to_string(), "img:jq".to_string())]),
        )
    }

    #[test]
    fn names_resolve_to_their_images() {
        let t = templates();
        assert_eq!(t.resolve(None).unwrap().image, None);
        assert_eq!(t.resolve(Some("default")).unwrap().image, None);
        assert_eq!(
            t.resolve(Some("jq")).unwrap().image.as_deref(),
            Some("img:jq")
        );
        assert_eq!(t.resolve_template("jq").unwrap(), "img:jq");
        assert_eq!(t.resolve_template("default").unwrap(), "img:default");
        assert_eq!(t.names(), vec!["default", "jq"]);
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_known_ones() {
        let err = templates().resolve(Some("nope")).unwrap_err().to_string();
        assert!(err.contains("no template \"nope\""), "{err}");
        assert!(err.contains("default, jq"), "{err}");
        assert!(templates().resolve_template("Default").is_err());
    }
}
