//! Templates (`[[templates]]`): the default recipe plus a template's extra Debian packages,
//! wheels and files, built offline the same way and tagged
//! `sandboxd/sandbox:tpl-<name>-<16 hex>`.
//!
//! The hash covers the default recipe's hash and everything the template adds (package and
//! wheel names, the bytes of every wheel in `wheel_dir` and of every copied file, their
//! targets and modes), so a changed template or recipe makes the next build a real one and
//! a session never runs a stale one. The embedded recipe is not edited: the written-out
//! copy gets the extra packages appended to its packages.txt and one more step at the end of
//! its customize.sh (`template/apply.sh`), so the default image's hash does not move.

use std::io;
use std::path::{Path, PathBuf};

use sandboxd_core::config::TemplateConfig;
use sha2::{Digest, Sha256};

use super::recipe::recipe_hash;
use super::{IMAGE_REPO, ImageError};

/// Debian's pip, installed into a template's image when it lists wheels.
const PIP_PACKAGE: &str = "python3-pip";

fn unreadable(path: &Path, source: io::Error) -> ImageError {
    ImageError::TemplateInput {
        path: path.to_owned(),
        source,
    }
}

/// The `.whl` files of the template's wheel directory, sorted by name.
fn wheel_files(t: &TemplateConfig) -> Result<Vec<PathBuf>, ImageError> {
    let Some(dir) = t.wheel_dir.as_deref().filter(|_| !t.wheels.is_empty()) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| unreadable(dir, e))? {
        let path = entry.map_err(|e| unreadable(dir, e))?.path();
        if path.extension().is_some_and(|x| x == "whl") && path.is_file() {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

/// The tag template `t` builds under: its name and the hash of the recipe plus what it adds
/// (reading its wheels and files; an unreadable one is an error naming it).
pub fn template_tag(t: &TemplateConfig) -> Result<String, ImageError> {
    let mut hasher = Sha256::new();
    let mut put = |bytes: &[u8]| {
        // Length prefixes keep ("ab", "c") and ("a", "bc") from hashing alike.
        hasher.update((bytes.len() as u64).to_le_bytes());
        hasher.update(bytes);
    };
    put(recipe_hash().as_bytes());
    put(t.name.as_bytes());
    for p in &t.packages {
        put(p.as_bytes());
    }
    for w in &t.wheels {
        put(w.as_bytes());
    }
    for path in wheel_files(t)? {
        put(path.file_name().unwrap_or_default().as_encoded_bytes());
        put(&std::fs::read(&path).map_err(|e| unreadable(&path, e))?);
    }
    for f in &t.files {
        put(f.to.as_bytes());
        put(f.mode.as_deref().unwrap_or("0644").as_bytes());
        put(&std::fs::read(&f.from).map_err(|e| unreadable(&f.from, e))?);
    }
    let mut hex = hex::encode(hasher.finalize());
    hex.truncate(16);
    Ok(format!("{IMAGE_REPO}:tpl-{}-{hex}", t.name))
}

/// `'…'` for bash: the config check already allows no quote in names and paths, this makes
/// sure of it.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The step customize.sh runs last for template `t`: copy its files in, install its wheels.
fn apply_script(t: &TemplateConfig) -> String {
    let mut script = String::from(
        "#!/bin/bash\n# A template's additions (written by sandboxd, see image/template.rs).\n\
         set -euo pipefail\nroot=${1:?}\nt=\"$SANDBOXD_RECIPE_DIR/template\"\n",
    );
    script.push_str(&format!(
        "echo {} >&2\n",
        quote(&format!("I: sandboxd: template {}", t.name))
    ));
    for (i, f) in t.files.iter().enumerate() {
        let mode = f.mode.as_deref().unwrap_or("0644");
        script.push_str(&format!(
            "install -D -o root -g root -m {} \"$t/files/{i}\" \"$root\"{}\n",
            quote(mode.trim_start_matches("0o")),
            quote(&f.to)
        ));
    }
    if !t.wheels.is_empty() {
        let names: Vec<String> = t.wheels.iter().map(|w| quote(w)).collect();
        script.push_str(&format!(
            "rm -rf \"$root/tmp/sandboxd-wheels\"\ncp -r \"$t/wheels\" \"$root/tmp/sandboxd-wheels\"\n\
             chroot \"$root\" python3 -m pip install --no-index --no-cache-dir \
             --break-system-packages --find-links /tmp/sandboxd-wheels {} >&2\n\
             rm -rf \"$root/tmp/sandboxd-wheels\"\n",
            names.join(" ")
        ));
    }
    script
}

/// Adds template `t` to the recipe written out in `dir`.
pub(super) fn add_to_recipe(dir: &Path, t: &TemplateConfig) -> Result<(), ImageError> {
    let io = |path: &Path, source: io::Error| ImageError::Workspace {
        path: path.to_owned(),
        source,
    };
    let packages = dir.join("packages.txt");
    let mut list = std::fs::read_to_string(&packages).map_err(|e| io(&packages, e))?;
    list.push_str(&format!("\n# template {}\n", t.name));
    for p in &t.packages {
        list.push_str(&format!("{p}\n"));
    }
    if !t.wheels.is_empty() {
        list.push_str(&format!("{PIP_PACKAGE}\n"));
    }
    std::fs::write(&packages, list).map_err(|e| io(&packages, e))?;

    let tdir = dir.join("template");
    for sub in ["files", "wheels"] {
        std::fs::create_dir_all(tdir.join(sub)).map_err(|e| io(&tdir, e))?;
    }
    for (i, f) in t.files.iter().enumerate() {
        std::fs::copy(&f.from, tdir.join("files").join(i.to_string()))
            .map_err(|e| unreadable(&f.from, e))?;
    }
    for wheel in wheel_files(t)? {
        let to = tdir
            .join("wheels")
            .join(wheel.file_name().unwrap_or_default());
        std::fs::copy(&wheel, to).map_err(|e| unreadable(&wheel, e))?;
    }
    let apply = tdir.join("apply.sh");
    std::fs::write(&apply, apply_script(t)).map_err(|e| io(&apply, e))?;
    let customize = dir.join("customize.sh");
    let mut hook = std::fs::read_to_string(&customize).map_err(|e| io(&customize, e))?;
    hook.push_str("\n# The template's additions, last (sandboxd image build --template).\n");
    hook.push_str("bash \"$recipe_dir/template/apply.sh\" \"$root\"\n");
    std::fs::write(&customize, hook).map_err(|e| io(&customize, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandboxd_core::config::TemplateFile;

    fn jq() -> TemplateConfig {
        TemplateConfig {
            name: "jq".into(),
            packages: vec!["jq".into()],
            wheels: vec![],
            wheel_dir: None,
            files: vec![],
        }
    }

    #[test]
    fn the_tag_names_the_template_and_moves_with_its_content() {
        let tag = template_tag(&jq()).unwrap();
        assert!(tag.starts_with("sandboxd/sandbox:tpl-jq-"), "{tag}");
        assert_eq!(tag.len(), "sandboxd/sandbox:tpl-jq-".len() + 16);
        assert_eq!(tag, template_tag(&jq()).unwrap());
        let mut more = jq();
        more.packages.push("bc".into());
        assert_ne!(tag, template_tag(&more).unwrap());

        let dir = super::super::build::TempDir::create().unwrap();
        let file = dir.path().join("a.conf");
        std::fs::write(&file, "one").unwrap();
        let mut with_file = jq();
        with_file.files.push(TemplateFile {
            from: file.clone(),
            to: "/etc/a.conf".into(),
            mode: None,
        });
        let first = template_tag(&with_file).unwrap();
        std::fs::write(&file, "two").unwrap();
        assert_ne!(first, template_tag(&with_file).unwrap());
        std::fs::remove_file(&file).unwrap();
        let err = template_tag(&with_file).unwrap_err().to_string();
        assert!(err.contains("a.conf"), "{err}");
    }

    #[test]
    fn the_recipe_gets_the_packages_and_a_last_step() {
        let dir = super::super::build::TempDir::create().unwrap();
        super::super::recipe::write_recipe(dir.path()).unwrap();
        let mut t = jq();
        t.wheels = vec!["tabulate".into()];
        t.wheel_dir = Some(dir.path().join("recipe-wheels"));
        std::fs::create_dir(dir.path().join("recipe-wheels")).unwrap();
        add_to_recipe(dir.path(), &t).unwrap();
        let packages = std::fs::read_to_string(dir.path().join("packages.txt")).unwrap();
        assert!(packages.ends_with("jq\npython3-pip\n"), "{packages}");
        let hook = std::fs::read_to_string(dir.path().join("customize.sh")).unwrap();
        assert!(hook.trim_end().ends_with("template/apply.sh\" \"$root\""));
        let apply = std::fs::read_to_string(dir.path().join("template/apply.sh")).unwrap();
        assert!(
            apply.contains("--no-index") && apply.contains("'tabulate'"),
            "{apply}"
        );
    }
}
