//! `sandboxd image build [--template NAME] | status`, and the image check every
//! sandbox-needing command runs.

use std::io::Write;
use std::process::ExitCode;

use sandboxd_docker as docker;
use sandboxd_docker::image::{self as docker_image, BuildOutcome, BuildProgress};

use super::Ctx;
use sandboxd_core::config::TemplateConfig;

#[derive(clap::Subcommand, Debug)]
pub(crate) enum ImageCommand {
    /// Build the sandbox image offline (mmdebstrap from this host's apt sources). A no-op
    /// when the recipe is unchanged, unless --force.
    Build {
        #[arg(long)]
        force: bool,
        /// Show every line of the build log, not only the steps.
        #[arg(long, short)]
        verbose: bool,
        /// Build the image of this [[templates]] entry of the config instead of the default.
        #[arg(long, value_name = "NAME")]
        template: Option<String>,
    },
    /// Say whether the image for this version, and each template's, is present.
    Status,
}

fn reporter(verbose: bool) -> impl Fn(BuildProgress) + Send + Sync {
    move |p| match p {
        BuildProgress::Step(s) => eprintln!("[image] {s}"),
        BuildProgress::Log(l) if verbose => eprintln!("        {l}"),
        BuildProgress::Log(_) => {
            eprint!(".");
            let _ = std::io::stderr().flush();
        }
    }
}

/// The image tag to run, building the image first (with progress) when it is missing.
pub(crate) async fn ensure(docker: &sandboxd_docker::Engine) -> anyhow::Result<String> {
    if !docker_image::image_present(docker).await? {
        eprintln!(
            "sandboxd: the sandbox image {} is not built yet; building it now (a minute or two; `sandboxd image build` does this alone)",
            docker_image::image_tag()
        );
    }
    let report = reporter(false);
    Ok(docker_image::ensure_image(docker, &report).await?)
}

/// The `[[templates]]` entry `name`, or an error listing them.
fn template<'a>(ctx: &'a Ctx, name: &str) -> anyhow::Result<&'a TemplateConfig> {
    let known = &ctx.config.templates;
    known.iter().find(|t| t.name == name).ok_or_else(|| {
        let names: Vec<&str> = known.iter().map(|t| t.name.as_str()).collect();
        anyhow::anyhow!(
            "no template {name:?} in the config's [[templates]]; the templates are: {}",
            if names.is_empty() {
                "(none)".to_string()
            } else {
                names.join(", ")
            }
        )
    })
}

/// One line per image: the default's, then each template's; false if any is missing.
async fn status(ctx: &Ctx, engine: &sandboxd_docker::Engine) -> anyhow::Result<bool> {
    let mut all = true;
    let mut images = vec![("default".to_string(), docker_image::image_tag())];
    for t in &ctx.config.templates {
        images.push((t.name.clone(), docker_image::template_tag(t)?));
    }
    for (name, tag) in images {
        if docker_image::tag_present(engine, &tag).await? {
            println!("{name}: {tag} is present");
        } else {
            all = false;
            let build = match name.as_str() {
                "default" => "sandboxd image build".to_string(),
                n => format!("sandboxd image build --template {n}"),
            };
            println!("{name}: {tag} is missing: run `{build}`");
        }
    }
    Ok(all)
}

pub(crate) async fn main(ctx: Ctx, cmd: ImageCommand) -> anyhow::Result<ExitCode> {
    let engine = docker::connect().await?;
    match cmd {
        ImageCommand::Build {
            force,
            verbose,
            template: name,
        } => {
            let report = reporter(verbose);
            let outcome = match name.as_deref() {
                Some(n) => {
                    let t = template(&ctx, n)?;
                    docker_image::build_template(&engine, t, force, &report).await?
                }
                None => docker_image::build_image(&engine, force, &report).await?,
            };
            match outcome {
                BuildOutcome::UpToDate { tag } => {
                    println!(
                        "{tag} is up to date: the recipe has not changed, nothing was built (use --force to rebuild)"
                    );
                }
                BuildOutcome::Built {
                    tag,
                    size_bytes,
                    seconds,
                } => {
                    eprintln!();
                    let also = match name {
                        Some(_) => String::new(),
                        None => format!(" (also tagged {}:latest)", docker_image::IMAGE_REPO),
                    };
                    println!(
                        "built {tag}{also}: {:.0} MB in {seconds:.0} s",
                        size_bytes as f64 / 1e6
                    );
                }
            }
        }
        ImageCommand::Status => {
            if !status(&ctx, &engine).await? {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
