//! Writing rendered files to disk, or checking that disk matches.

use std::fs;
use std::path::{Path, PathBuf};

use crate::{Error, GeneratedFile};

/// What [`crate::generate`] does with the rendered files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Write files that differ, remove generated files that are no longer rendered.
    Write,
    /// Change nothing; report every file that [`Mode::Write`] would change.
    Check,
}

/// The result of a [`crate::generate`] run. Paths are relative to the deploy directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Every file the generator renders.
    pub rendered: Vec<PathBuf>,
    /// Files that were (in check mode: would be) written or removed.
    pub stale: Vec<PathBuf>,
}

/// Brings `deploy_dir` in line with `files` (or reports what differs); files under it that start
/// with one of `headers` but are no longer rendered are ours and removed.
pub(crate) fn sync(
    deploy_dir: &Path,
    files: &[GeneratedFile],
    headers: &[&str],
    mode: Mode,
) -> Result<Outcome, Error> {
    if mode == Mode::Write {
        // Fail on the directory itself, with its own path, before reading anything under it.
        fs::create_dir_all(deploy_dir).map_err(|source| Error::Io {
            action: "create directory",
            path: deploy_dir.to_owned(),
            source,
        })?;
    }
    let mut outcome = Outcome::default();
    for file in files {
        let path = deploy_dir.join(&file.path);
        outcome.rendered.push(file.path.clone());
        if read_if_exists(&path)?.as_deref() == Some(file.contents.as_str()) {
            continue;
        }
        outcome.stale.push(file.path.clone());
        if mode == Mode::Write {
            write(&path, &file.contents)?;
        }
    }
    for orphan in orphaned_generated_files(deploy_dir, files, headers)? {
        if mode == Mode::Write {
            let path = deploy_dir.join(&orphan);
            fs::remove_file(&path).map_err(|source| Error::Io {
                action: "remove",
                path,
                source,
            })?;
        }
        outcome.stale.push(orphan);
    }
    Ok(outcome)
}

fn read_if_exists(path: &Path) -> Result<Option<String>, Error> {
    match fs::read(path) {
        // A file that is not UTF-8 cannot equal what we render: treat it as different.
        Ok(bytes) => Ok(Some(String::from_utf8(bytes).unwrap_or_default())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            action: "read",
            path: path.to_owned(),
            source,
        }),
    }
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|source| Error::Io {
            action: "create directory",
            path: dir.to_owned(),
            source,
        })?;
    }
    fs::write(path, contents).map_err(|source| Error::Io {
        action: "write",
        path: path.to_owned(),
        source,
    })
}

/// Files carrying our header, in the directories we generate into, that we no longer render: a
/// renamed CRD or removed manifest. Files without the header are a user's and are left alone.
fn orphaned_generated_files(
    deploy_dir: &Path,
    files: &[GeneratedFile],
    headers: &[&str],
) -> Result<Vec<PathBuf>, Error> {
    let mut dirs: Vec<PathBuf> = files
        .iter()
        .map(|f| f.path.parent().map(Path::to_path_buf).unwrap_or_default())
        .collect();
    dirs.sort();
    dirs.dedup();
    let mut orphans = Vec::new();
    for dir in dirs {
        let full = deploy_dir.join(&dir);
        let entries = match fs::read_dir(&full) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(Error::Io {
                    action: "read",
                    path: full,
                    source,
                });
            }
        };
        for entry in entries {
            let entry = entry.map_err(|source| Error::Io {
                action: "read",
                path: full.clone(),
                source,
            })?;
            let relative = dir.join(entry.file_name());
            let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
            if !is_file || files.iter().any(|f| f.path == relative) {
                continue;
            }
            let text = read_if_exists(&entry.path())?.unwrap_or_default();
            if headers.iter().any(|header| text.starts_with(header)) {
                orphans.push(relative);
            }
        }
    }
    orphans.sort();
    Ok(orphans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::HEADER;

    fn file(path: &str, body: &str) -> GeneratedFile {
        GeneratedFile {
            path: PathBuf::from(path),
            contents: format!("{HEADER}{body}"),
        }
    }

    #[test]
    fn check_reports_missing_and_changed_then_write_fixes_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = [file("a/one.yaml", "x: 1\n"), file("two.yaml", "y: 2\n")];
        let first = sync(dir.path(), &files, &[HEADER], Mode::Check).expect("check");
        assert_eq!(
            first.stale,
            [PathBuf::from("a/one.yaml"), PathBuf::from("two.yaml")]
        );
        assert!(
            !dir.path().join("two.yaml").exists(),
            "check mode writes nothing"
        );

        sync(dir.path(), &files, &[HEADER], Mode::Write).expect("write");
        assert!(
            sync(dir.path(), &files, &[HEADER], Mode::Check)
                .expect("check")
                .stale
                .is_empty()
        );

        fs::write(dir.path().join("two.yaml"), "edited by hand\n").expect("edit");
        let after_edit = sync(dir.path(), &files, &[HEADER], Mode::Check).expect("check");
        assert_eq!(after_edit.stale, [PathBuf::from("two.yaml")]);
    }

    #[test]
    fn orphaned_generated_files_are_removed_but_user_files_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = [file("crds/new.yaml", "x: 1\n")];
        sync(dir.path(), &files, &[HEADER], Mode::Write).expect("write");
        fs::write(
            dir.path().join("crds/old.yaml"),
            format!("{HEADER}old: 1\n"),
        )
        .expect("old");
        fs::write(dir.path().join("crds/mine.yaml"), "mine: 1\n").expect("user file");

        let check = sync(dir.path(), &files, &[HEADER], Mode::Check).expect("check");
        assert_eq!(check.stale, [PathBuf::from("crds/old.yaml")]);
        sync(dir.path(), &files, &[HEADER], Mode::Write).expect("write");
        assert!(!dir.path().join("crds/old.yaml").exists());
        assert!(dir.path().join("crds/mine.yaml").exists());
    }

    #[test]
    fn unwritable_directory_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let blocker = dir.path().join("not-a-dir");
        fs::write(&blocker, "").expect("file");
        let err = sync(
            &blocker.join("deploy"),
            &[file("x.yaml", "")],
            &[HEADER],
            Mode::Write,
        )
        .expect_err("cannot write under a file");
        assert!(err.to_string().contains("not-a-dir"), "{err}");
    }
}
