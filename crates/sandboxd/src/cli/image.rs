//! `sandboxd image build | status`, and the image check every sandbox-needing command runs.

use std::io::Write;
use std::process::ExitCode;

use sandboxd_docker as docker;
use sandboxd_docker::image::{self as docker_image, BuildOutcome, BuildProgress};

use super::Ctx;

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
    },
    /// Say whether the image for this version is present.
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

pub(crate) async fn main(_ctx: Ctx, cmd: ImageCommand) -> anyhow::Result<ExitCode> {
    let engine = docker::connect().await?;
    match cmd {
        ImageCommand::Build { force, verbose } => {
            let report = reporter(verbose);
            match docker_image::build_image(&engine, force, &report).await? {
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
                    println!(
                        "built {tag} (also tagged {}:latest): {:.0} MB in {seconds:.0} s",
                        docker_image::IMAGE_REPO,
                        size_bytes as f64 / 1e6
                    );
                }
            }
        }
        ImageCommand::Status => {
            let tag = docker_image::image_tag();
            if docker_image::image_present(&engine).await? {
                println!("{tag} is present");
            } else {
                println!("{tag} is missing: run `sandboxd image build`");
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
