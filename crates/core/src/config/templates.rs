//! `[[templates]]`: named sandbox images beyond the default, each the default recipe plus
//! extra Debian packages, Python wheels from a local directory and files copied in, built
//! offline by `sandboxd image build --template NAME` (the Docker crate's image/template.rs).
//!
//! Everything here is checked at load, because it ends up in a build script run as root:
//! names are plain identifiers, package and wheel names Debian's and PyPI's character sets,
//! and every path absolute with no `..`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The name a session uses for the image `sandboxd image build` makes with no template.
pub const DEFAULT_TEMPLATE: &str = "default";

/// One named image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    /// What sessions name it by: lowercase letters, digits and `-`, up to 32 characters.
    pub name: String,
    /// Debian packages installed on top of the default ones, from the host's apt sources.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Python distributions installed with `pip --no-index` from `wheel_dir` (which then also
    /// installs `python3-pip` into the image).
    #[serde(default)]
    pub wheels: Vec<String>,
    /// A host directory of `.whl` files (a local index), required when `wheels` is not empty.
    #[serde(default)]
    pub wheel_dir: Option<PathBuf>,
    /// Host files copied into the image, world-readable and owned by root.
    #[serde(default)]
    pub files: Vec<TemplateFile>,
}

/// A host file copied into a template's image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateFile {
    /// The host file (absolute).
    pub from: PathBuf,
    /// Where it goes in the image (absolute, not under /workspace or /tmp, which are mounted
    /// over at run time).
    pub to: String,
    /// Its permission bits in octal (default "0644").
    #[serde(default)]
    pub mode: Option<String>,
}

fn invalid(name: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        key: format!("templates.{name}"),
        message,
    }
}

fn is_debian_name(s: &str) -> bool {
    s.len() >= 2
        && s.len() <= 100
        && s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b))
}

fn is_wheel_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

fn is_clean_absolute(p: &str) -> bool {
    p.starts_with('/')
        && p.len() <= 1024
        && !p.chars().any(|c| c.is_control())
        && p.split('/').all(|c| c != ".." && c != ".")
}

impl TemplateConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let name = &self.name;
        let good_name = !name.is_empty()
            && name.len() <= 32
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !good_name || name == DEFAULT_TEMPLATE {
            return Err(invalid(
                name,
                "a template name is 1 to 32 lowercase letters, digits and `-`, starting with a \
                 letter, and not \"default\""
                    .into(),
            ));
        }
        if let Some(p) = self.packages.iter().find(|p| !is_debian_name(p)) {
            return Err(invalid(name, format!("{p:?} is not a Debian package name")));
        }
        if let Some(w) = self.wheels.iter().find(|w| !is_wheel_name(w)) {
            return Err(invalid(
                name,
                format!("{w:?} is not a Python distribution name"),
            ));
        }
        match &self.wheel_dir {
            None if !self.wheels.is_empty() => {
                return Err(invalid(
                    name,
                    "`wheels` needs `wheel_dir`, the local directory of .whl files".into(),
                ));
            }
            Some(d) if !d.is_absolute() => {
                return Err(invalid(name, format!("wheel_dir {d:?} must be absolute")));
            }
            _ => {}
        }
        for f in &self.files {
            let to = f.to.as_str();
            let mounted = ["/workspace", "/tmp", "/proc", "/dev", "/sys"]
                .iter()
                .any(|m| to == *m || to.starts_with(&format!("{m}/")));
            if !f.from.is_absolute() || !is_clean_absolute(to) || to == "/" || mounted {
                return Err(invalid(
                    name,
                    format!(
                        "file {:?} -> {to:?}: both paths must be absolute, without `..`, and the \
                         target not under /workspace, /tmp, /proc, /dev or /sys",
                        f.from
                    ),
                ));
            }
            if let Some(m) = &f.mode {
                crate::sandbox::file_mode::FileMode::parse(m)
                    .map_err(|e| invalid(name, format!("file {to}: mode {e}")))?;
            }
        }
        Ok(())
    }
}

/// Checks every template and that no name is used twice.
pub fn validate(templates: &[TemplateConfig]) -> Result<(), ConfigError> {
    let mut seen = std::collections::BTreeSet::new();
    for t in templates {
        t.validate()?;
        if !seen.insert(t.name.as_str()) {
            return Err(invalid(&t.name, "the name is used twice".into()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(name: &str) -> TemplateConfig {
        TemplateConfig {
            name: name.into(),
            packages: vec!["jq".into(), "libc6-dev".into(), "g++".into()],
            wheels: vec![],
            wheel_dir: None,
            files: vec![],
        }
    }

    #[test]
    fn good_templates_pass() {
        let mut t = template("data-1");
        t.wheels = vec!["tabulate".into()];
        t.wheel_dir = Some("/srv/wheels".into());
        t.files = vec![TemplateFile {
            from: "/srv/a.conf".into(),
            to: "/etc/a.conf".into(),
            mode: Some("0755".into()),
        }];
        validate(&[t, template("jq")]).unwrap();
    }

    #[test]
    fn hostile_templates_are_refused_with_the_reason() {
        let says = |t: TemplateConfig, what: &str| {
            let err = validate(&[t]).expect_err(what).to_string();
            assert!(err.contains(what), "{err}");
        };
        says(template("default"), "not \"default\"");
        says(template("Has Space"), "lowercase");
        says(template("a;rm"), "lowercase");
        let mut t = template("x");
        t.packages.push("jq; rm -rf /".into());
        says(t, "not a Debian package name");
        let mut t = template("x");
        t.wheels.push("tabulate".into());
        says(t, "needs `wheel_dir`");
        let mut t = template("x");
        t.wheels.push("$(id)".into());
        t.wheel_dir = Some("/w".into());
        says(t, "not a Python distribution name");
        for to in ["/workspace/x", "/tmp/x", "etc/x", "/etc/../x", "/"] {
            let mut t = template("x");
            t.files.push(TemplateFile {
                from: "/a".into(),
                to: to.into(),
                mode: None,
            });
            says(t, "must be absolute");
        }
        let mut t = template("x");
        t.files.push(TemplateFile {
            from: "/a".into(),
            to: "/etc/a".into(),
            mode: Some("4755".into()),
        });
        says(t, "setuid");
        let err = validate(&[template("x"), template("x")]).unwrap_err();
        assert!(err.to_string().contains("used twice"), "{err}");
    }
}
