//! Deterministic tar: the image's layer and the archive around it are both written here.

use std::collections::BTreeMap;

use tar::{EntryType, Header};

/// What a tar entry holds.
#[derive(Debug)]
pub(crate) enum Contents {
    Directory,
    File(Vec<u8>),
}

/// One entry: contents plus the fixed metadata written for it.
#[derive(Debug)]
pub(crate) struct Entry {
    pub contents: Contents,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Entry {
    pub fn directory(mode: u32) -> Self {
        Self {
            contents: Contents::Directory,
            mode,
            uid: 0,
            gid: 0,
        }
    }

    pub fn file(data: Vec<u8>, mode: u32) -> Self {
        Self {
            contents: Contents::File(data),
            mode,
            uid: 0,
            gid: 0,
        }
    }
}

/// Entries keyed by relative path (no leading or trailing `/`). A `BTreeMap` so the archive's
/// order is the paths' byte order, which also puts every directory before what it contains.
pub(crate) type Tree = BTreeMap<String, Entry>;

/// Adds a directory entry for every ancestor of `path` that has none yet.
pub(crate) fn add_parents(tree: &mut Tree, path: &str) {
    let mut end = 0;
    while let Some(i) = path[end..].find('/') {
        end += i;
        tree.entry(path[..end].to_owned())
            .or_insert_with(|| Entry::directory(0o755));
        end += 1;
    }
}

/// Writes `tree` as a tar with every timestamp `mtime` and no user or group names, so only the
/// inputs decide the bytes.
pub(crate) fn write(tree: &Tree, mtime: u64) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, entry) in tree {
        let mut header = Header::new_ustar();
        header.set_mode(entry.mode);
        header.set_uid(entry.uid.into());
        header.set_gid(entry.gid.into());
        header.set_mtime(mtime);
        match &entry.contents {
            Contents::Directory => {
                header.set_entry_type(EntryType::Directory);
                header.set_size(0);
                builder.append_data(&mut header, format!("{path}/"), std::io::empty())?;
            }
            Contents::File(data) => {
                header.set_entry_type(EntryType::Regular);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, path, data.as_slice())?;
            }
        }
    }
    builder.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_come_before_children_and_are_added_once() {
        let mut tree = Tree::new();
        tree.insert("usr/lib/x/libc.so.6".into(), Entry::file(vec![1], 0o755));
        add_parents(&mut tree, "usr/lib/x/libc.so.6");
        tree.insert("usr/bin/tool".into(), Entry::file(vec![2], 0o755));
        add_parents(&mut tree, "usr/bin/tool");
        tree.insert("usr-local".into(), Entry::file(vec![3], 0o644));
        let paths: Vec<&str> = tree.keys().map(String::as_str).collect();
        assert_eq!(
            paths,
            [
                "usr",
                "usr-local",
                "usr/bin",
                "usr/bin/tool",
                "usr/lib",
                "usr/lib/x",
                "usr/lib/x/libc.so.6"
            ]
        );
    }
}
