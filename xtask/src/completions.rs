//! `cargo xtask completions [--out DIR]`: shell completions (bash, zsh, fish, elvish,
//! PowerShell) and the man page `manager.1` of the manager, generated from the same clap
//! definitions as its `--help`, so they list every flag it takes.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap_complete::Shell;

/// The binary the completions complete.
const BINARY: &str = "manager";

/// Writes the completions and the man page into `out` (default: `completions/` in the cargo
/// target directory); returns the files written.
pub fn run(out: Option<PathBuf>) -> anyhow::Result<()> {
    let out = out.unwrap_or_else(|| crate::target_dir().join("completions"));
    for path in write_all(&out)? {
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn write_all(out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut written = Vec::new();
    for shell in [
        Shell::Bash,
        Shell::Zsh,
        Shell::Fish,
        Shell::Elvish,
        Shell::PowerShell,
    ] {
        let mut command = manager::config::Flags::command();
        let path = clap_complete::generate_to(shell, &mut command, BINARY, out)
            .with_context(|| format!("writing the {shell} completions into {}", out.display()))?;
        written.push(path);
    }
    let page = out.join(format!("{BINARY}.1"));
    let mut text = Vec::new();
    clap_mangen::Man::new(manager::config::Flags::command())
        .render(&mut text)
        .context("rendering the man page")?;
    std::fs::write(&page, text).with_context(|| format!("writing {}", page.display()))?;
    written.push(page);
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shell_and_the_man_page_know_every_flag() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let written = write_all(dir.path()).expect("written");
        assert_eq!(written.len(), 6, "{written:?}");
        let longs: Vec<String> = manager::config::Flags::command()
            .get_arguments()
            .filter_map(|arg| arg.get_long().map(str::to_owned))
            .collect();
        assert!(longs.iter().any(|l| l == "leader-elect"), "{longs:?}");
        for path in &written {
            let text = std::fs::read_to_string(path).expect("readable");
            for long in &longs {
                // As each shell writes it; the man page escapes dashes for roff.
                let forms = [
                    format!("--{long}"),
                    format!("-l {long}"),
                    format!("--{long}").replace('-', "\\-"),
                ];
                assert!(
                    forms.iter().any(|form| text.contains(form.as_str())),
                    "--{long} missing from {}",
                    path.display()
                );
            }
        }
    }
}
