//! The shared libraries a dynamically linked binary loads, so an image can carry exactly those.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// A library a binary needs, and where the image must hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedLibrary {
    /// The file on this machine (possibly a symlink; its target's contents are what is copied).
    pub source: PathBuf,
    /// The absolute path the dynamic loader will look at inside the image.
    pub destination: String,
}

/// The dynamic loader and the shared libraries `binary` needs, as this machine resolves them.
///
/// The loader keeps the path recorded in the binary (its `PT_INTERP`, e.g.
/// `/lib64/ld-linux-x86-64.so.2`), since the kernel opens exactly that path. Each library keeps
/// the path `ldd` resolved its soname to, which is in the loader's default search directories on
/// this machine; symlinks there (`libfoo.so.1 -> libfoo.so.1.2.3`) are followed when copying, so
/// the image holds the real file under the soname path. A statically linked binary needs nothing.
///
/// # Caveats
///
/// Libraries opened with `dlopen` at run time are not listed by `ldd` and are not found. A
/// library found only through `/etc/ld.so.conf` (not a default directory such as
/// `/lib/<triplet>` or `/usr/lib`) is copied to its path but the image has no loader cache
/// pointing at it.
///
/// # Errors
///
/// [`Error::Elf`] when `binary` is not an ELF file, [`Error::Ldd`] when `ldd` cannot be run or
/// fails, [`Error::MissingLibraries`] when a library is not installed here.
pub fn shared_libraries(binary: &Path) -> Result<Vec<SharedLibrary>, Error> {
    let bytes = std::fs::read(binary).map_err(|source| Error::Source {
        path: binary.to_owned(),
        source,
    })?;
    let Some(interpreter) = interpreter(&bytes).map_err(|reason| Error::Elf {
        path: binary.to_owned(),
        reason,
    })?
    else {
        return Ok(Vec::new());
    };

    let output = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|error| Error::Ldd {
            binary: binary.to_owned(),
            message: format!("cannot run ldd: {error}"),
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stdout.contains("not a dynamic executable") || stderr.contains("not a dynamic executable") {
        return Ok(Vec::new());
    }
    if !output.status.success() {
        return Err(Error::Ldd {
            binary: binary.to_owned(),
            message: format!("ldd exited with {}: {}", output.status, stderr.trim()),
        });
    }

    let mut libraries = vec![SharedLibrary {
        source: PathBuf::from(&interpreter),
        destination: interpreter,
    }];
    let mut missing = Vec::new();
    for line in stdout.lines() {
        match parse_ldd_line(line) {
            LddLine::Library(path) => {
                if !libraries.iter().any(|l| l.destination == path) {
                    libraries.push(SharedLibrary {
                        source: PathBuf::from(&path),
                        destination: path,
                    });
                }
            }
            LddLine::NotFound(soname) => missing.push(soname),
            LddLine::Other => {}
        }
    }
    if !missing.is_empty() {
        return Err(Error::MissingLibraries {
            binary: binary.to_owned(),
            libraries: missing,
        });
    }
    libraries.sort_by(|a, b| a.destination.cmp(&b.destination));
    Ok(libraries)
}

#[derive(Debug, PartialEq, Eq)]
enum LddLine {
    /// A library resolved to an absolute path (the loader's own line included).
    Library(String),
    /// A soname `ldd` could not resolve.
    NotFound(String),
    /// The kernel's vDSO (no file), `statically linked`, or anything else without a file.
    Other,
}

/// One line of `ldd`: `soname => /path (0x…)`, `soname => not found`, `/path (0x…)` or
/// `linux-vdso.so.1 (0x…)`.
fn parse_ldd_line(line: &str) -> LddLine {
    let line = line.trim();
    let without_address = match line.rfind(" (0x") {
        Some(i) if line.ends_with(')') => &line[..i],
        _ => line,
    };
    match without_address.split_once("=>") {
        Some((soname, target)) => {
            let target = target.trim();
            if target == "not found" {
                LddLine::NotFound(soname.trim().to_owned())
            } else if target.starts_with('/') {
                LddLine::Library(target.to_owned())
            } else {
                LddLine::Other
            }
        }
        None if without_address.starts_with('/') => LddLine::Library(without_address.to_owned()),
        None => LddLine::Other,
    }
}

/// The `PT_INTERP` path of an ELF file, or `None` when it has none (statically linked).
fn interpreter(elf: &[u8]) -> Result<Option<String>, &'static str> {
    const PT_INTERP: u32 = 3;
    if elf.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err("no ELF magic number");
    }
    let wide = match elf.get(4) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err("unknown ELF class"),
    };
    let big_endian = match elf.get(5) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err("unknown ELF byte order"),
    };
    let read = |offset: usize, len: usize| -> Result<u64, &'static str> {
        let bytes = offset
            .checked_add(len)
            .and_then(|end| elf.get(offset..end))
            .ok_or("truncated ELF header")?;
        let fold = |acc: u64, b: &u8| (acc << 8) | u64::from(*b);
        Ok(if big_endian {
            bytes.iter().fold(0, fold)
        } else {
            bytes.iter().rev().fold(0, fold)
        })
    };
    let to_usize = |v: u64| usize::try_from(v).map_err(|_| "ELF offset out of range");
    // Offsets of e_phoff, e_phentsize, e_phnum and, inside a program header, of p_type,
    // p_offset and p_filesz, for 64- and 32-bit ELF.
    let (phoff, phentsize, phnum) = if wide {
        (read(0x20, 8)?, read(0x36, 2)?, read(0x38, 2)?)
    } else {
        (read(0x1c, 4)?, read(0x2a, 2)?, read(0x2c, 2)?)
    };
    let (word, p_offset, p_filesz) = if wide { (8, 8, 0x20) } else { (4, 4, 0x10) };
    for i in 0..phnum {
        let header = to_usize(phoff)?
            .checked_add(to_usize(i * phentsize)?)
            .ok_or("ELF offset out of range")?;
        if read(header, 4)? != u64::from(PT_INTERP) {
            continue;
        }
        let offset = to_usize(read(header + p_offset, word)?)?;
        let size = to_usize(read(header + p_filesz, word)?)?;
        let raw = offset
            .checked_add(size)
            .and_then(|end| elf.get(offset..end))
            .ok_or("PT_INTERP points outside the file")?;
        let path = raw.split(|b| *b == 0).next().unwrap_or_default();
        let path = std::str::from_utf8(path).map_err(|_| "PT_INTERP is not UTF-8")?;
        if !path.starts_with('/') {
            return Err("PT_INTERP is not an absolute path");
        }
        return Ok(Some(path.to_owned()));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_are_classified() {
        assert_eq!(
            parse_ldd_line("\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0000000000)"),
            LddLine::Library("/lib/x86_64-linux-gnu/libc.so.6".into())
        );
        assert_eq!(
            parse_ldd_line("\t/lib64/ld-linux-x86-64.so.2 (0x00007f0000000000)"),
            LddLine::Library("/lib64/ld-linux-x86-64.so.2".into())
        );
        assert_eq!(
            parse_ldd_line("\tlibmissing.so.3 => not found"),
            LddLine::NotFound("libmissing.so.3".into())
        );
        assert_eq!(
            parse_ldd_line("\tlinux-vdso.so.1 (0x00007ffd00000000)"),
            LddLine::Other
        );
        assert_eq!(parse_ldd_line("\tstatically linked"), LddLine::Other);
    }

    /// A minimal 64-bit little-endian ELF with one program header.
    fn elf64(p_type: u32, interp: &[u8]) -> Vec<u8> {
        let mut elf = vec![0u8; 0x40 + 0x38];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
        elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        let offset = elf.len() as u64;
        elf[0x40..0x44].copy_from_slice(&p_type.to_le_bytes());
        elf[0x48..0x50].copy_from_slice(&offset.to_le_bytes());
        elf[0x60..0x68].copy_from_slice(&(interp.len() as u64).to_le_bytes());
        elf.extend_from_slice(interp);
        elf
    }

    #[test]
    fn the_interpreter_is_read_from_the_program_headers() {
        let elf = elf64(3, b"/lib64/ld-linux-x86-64.so.2\0");
        assert_eq!(
            interpreter(&elf).unwrap().as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        // A PT_LOAD only: statically linked.
        assert_eq!(interpreter(&elf64(1, b"")).unwrap(), None);
        assert!(interpreter(b"#!/bin/sh\n").is_err());
        assert!(interpreter(&elf64(3, b"/lib64/ld")[..0x50]).is_err());
    }

    #[test]
    fn a_missing_binary_is_named() {
        let error = shared_libraries(Path::new("/nonexistent/tool")).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/tool"), "{error}");
    }

    #[test]
    fn a_script_is_not_an_elf_binary() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("run.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let error = shared_libraries(&script).unwrap_err();
        assert!(matches!(error, Error::Elf { .. }), "{error}");
        assert!(error.to_string().contains("run.sh"), "{error}");
    }

    #[test]
    fn this_test_binary_needs_its_loader_and_libc() {
        let binary = std::env::current_exe().unwrap();
        let libraries = shared_libraries(&binary).unwrap();
        let interp = interpreter(&std::fs::read(&binary).unwrap()).unwrap();
        let Some(interp) = interp else {
            assert!(libraries.is_empty());
            return;
        };
        assert!(
            libraries.iter().any(|l| l.destination == interp),
            "{libraries:?}"
        );
        assert!(
            libraries
                .iter()
                .any(|l| l.destination.ends_with("/libc.so.6")),
            "{libraries:?}"
        );
        assert!(
            libraries.iter().all(|l| l.source.is_file()),
            "{libraries:?}"
        );
    }
}
