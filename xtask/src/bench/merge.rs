//! The results of several runs of the bench, reported as one.
//!
//! A whole comparison (three object counts for two managers, then recovery and failover)
//! can take longer than one sitting, so it can be measured a part at a time, e.g.
//! `--objects 100,1000 --phases workload`, `--objects 10000 --phases workload`, then
//! `--objects 10000 --phases recovery,failover`, and `--report` given the three files prints
//! them as one. What compares managers still comes from one run: each object count's runs,
//! the recovery and the failover are taken whole from one file. A count that a file measured
//! for only some of its managers (a run stopped part-way) gives way to a file that measured it
//! for every one. The files must hold the same
//! builds (by their binaries' digests, where recorded), measured on the same kind of machine
//! and cluster with the same settings; anything else is refused, naming what differs. The
//! kernel and compiler may differ, and then each file's are named.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::report::{Build, Machine, Results, Settings};

/// Results read from several files, and what was taken from each.
pub struct Merged {
    pub results: Results,
    /// One line per file: its path and what it measured.
    pub sources: Vec<String>,
}

/// Joins the results of `parts` (each a file's path and its contents), in the order given.
pub fn merge(parts: Vec<(PathBuf, Results)>) -> anyhow::Result<Merged> {
    let Some((first_path, first)) = parts.first() else {
        anyhow::bail!("--report: no results file given");
    };
    let mut merged = Results {
        builds: Vec::new(),
        runs: Vec::new(),
        recovery: Vec::new(),
        failover: Vec::new(),
        ..first.clone()
    };
    for (path, results) in &parts {
        same_machine(first_path, &first.machine, path, &results.machine)?;
        same_settings(first_path, &first.settings, path, &results.settings)?;
        add_builds(&mut merged.builds, path, &results.builds)?;
        if results.runs.is_empty() && results.recovery.is_empty() && results.failover.is_empty() {
            anyhow::bail!(
                "--report: {} holds no finished run, recovery or failover; leave it out",
                path.display()
            );
        }
    }
    let taken_from = choose_counts(&parts)?;
    // The kernel and compiler may differ between files: say which each ran on, rather than
    // let the first file's stand for all.
    let machines_differ = parts.iter().any(|(_, results)| {
        results.machine.kernel != first.machine.kernel
            || results.machine.rustc != first.machine.rustc
    });
    if machines_differ {
        merged.machine.kernel = distinct(parts.iter().map(|(_, r)| r.machine.kernel.as_str()));
        merged.machine.rustc = distinct(parts.iter().map(|(_, r)| r.machine.rustc.as_str()));
    }
    let mut recovery_from: Option<PathBuf> = None;
    let mut failover_from: Option<PathBuf> = None;
    let mut sources = Vec::new();
    for (index, (path, results)) in parts.iter().enumerate() {
        taken_once(
            "the recovery",
            &mut recovery_from,
            path,
            !results.recovery.is_empty(),
        )?;
        taken_once(
            "the failover",
            &mut failover_from,
            path,
            !results.failover.is_empty(),
        )?;
        let taken = |count: &usize| taken_from.get(count) == Some(&index);
        let counts = counts_of(results);
        let mut line = format!(
            "{}: {}",
            path.display(),
            what_was_taken(counts.iter().filter(|c| taken(c)), results)
        );
        for count in counts.iter().filter(|c| !taken(c)) {
            if let Some(&other) = taken_from.get(count) {
                let _ = write!(
                    line,
                    "; {count} objects left out, measured there for only some of its managers and in {} for every one",
                    parts[other].0.display()
                );
            }
        }
        if results.builds.is_empty() {
            line.push_str(" (its builds not recorded)");
        }
        if machines_differ {
            let _ = write!(
                line,
                " (on {}; {})",
                results.machine.kernel, results.machine.rustc
            );
        }
        sources.push(line);
    }
    for (index, (_, results)) in parts.into_iter().enumerate() {
        merged.runs.extend(
            results
                .runs
                .into_iter()
                .filter(|run| taken_from.get(&run.objects) == Some(&index)),
        );
        merged.recovery.extend(results.recovery);
        merged.failover.extend(results.failover);
    }
    Ok(Merged {
        results: merged,
        sources,
    })
}

/// Each value once, in the order first seen, joined by " or ".
fn distinct<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for value in values {
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen.join(" or ")
}

/// Adds a file's builds to those known, failing on another build of a manager already known.
fn add_builds(known: &mut Vec<Build>, path: &Path, builds: &[Build]) -> anyhow::Result<()> {
    for build in builds {
        match known.iter().find(|b| b.manager == build.manager) {
            Some(earlier) if earlier.digest != build.digest => anyhow::bail!(
                "--report: {} measured another build of {} ({}) than an earlier file ({}); results of different builds do not make one run",
                path.display(),
                build.manager,
                build.digest,
                earlier.digest
            ),
            Some(_) => {}
            None => known.push(build.clone()),
        }
    }
    Ok(())
}

/// For each object count, the index of the file whose runs of it are taken: the only file that
/// measured it, or of several, the only one that measured it for every manager it ran (a run
/// stopped part-way may have measured its largest count for one manager only).
fn choose_counts(parts: &[(PathBuf, Results)]) -> anyhow::Result<BTreeMap<usize, usize>> {
    let mut measured_in: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (index, (_, results)) in parts.iter().enumerate() {
        for count in counts_of(results) {
            measured_in.entry(count).or_default().push(index);
        }
    }
    measured_in
        .into_iter()
        .map(|(count, files)| {
            let complete: Vec<usize> = files
                .iter()
                .copied()
                .filter(|&index| measured_for_every_manager(&parts[index].1, count))
                .collect();
            match (&files[..], &complete[..]) {
                ([only], _) | (_, [only]) => Ok((count, *only)),
                _ => {
                    let names: Vec<String> = files
                        .iter()
                        .map(|&index| parts[index].0.display().to_string())
                        .collect();
                    anyhow::bail!(
                        "--report: {} each measured {count} objects; a count's ratios compare the runs of one bench, so give only one of them (a file that measured it for only some of its managers gives way to one that measured it for every one)",
                        names.join(" and ")
                    )
                }
            }
        })
        .collect()
}

/// The object counts a file has runs of.
fn counts_of(results: &Results) -> BTreeSet<usize> {
    results.runs.iter().map(|run| run.objects).collect()
}

/// Whether every manager the file measured has a run at `count`: the managers are its builds,
/// or in results from before builds were recorded, the managers of its runs.
fn measured_for_every_manager(results: &Results, count: usize) -> bool {
    let managers: BTreeSet<&str> = if results.builds.is_empty() {
        results
            .runs
            .iter()
            .map(|run| run.manager.as_str())
            .collect()
    } else {
        results.builds.iter().map(|b| b.manager.as_str()).collect()
    };
    managers.iter().all(|manager| {
        results
            .runs
            .iter()
            .any(|run| run.objects == count && run.manager == *manager)
    })
}

/// Fails unless `path` is the first file to hold `what`, and records it when it holds it.
fn taken_once(
    what: &str,
    from: &mut Option<PathBuf>,
    path: &Path,
    holds: bool,
) -> anyhow::Result<()> {
    if !holds {
        return Ok(());
    }
    if let Some(earlier) = from {
        anyhow::bail!(
            "--report: both {} and {} measured {what}; it compares the managers of one bench, so give only one of them",
            earlier.display(),
            path.display()
        );
    }
    *from = Some(path.to_owned());
    Ok(())
}

/// What is taken from a file, for its sources line.
fn what_was_taken<'a>(counts: impl Iterator<Item = &'a usize>, results: &Results) -> String {
    let mut taken: Vec<String> = counts.map(|count| format!("{count} objects")).collect();
    if !results.recovery.is_empty() {
        taken.push("recovery".to_owned());
    }
    if !results.failover.is_empty() {
        taken.push("failover".to_owned());
    }
    if taken.is_empty() {
        "nothing taken".to_owned()
    } else {
        taken.join(", ")
    }
}

/// Fails, naming the difference, unless two files were measured on the same kind of machine
/// and cluster (the kernel and compiler may differ; a different compiler builds another
/// binary, which the builds' digests tell).
fn same_machine(first: &Path, a: &Machine, path: &Path, b: &Machine) -> anyhow::Result<()> {
    let differences = [
        ("cores", a.cores.to_string(), b.cores.to_string()),
        (
            "memory (GiB)",
            a.memory_gib.to_string(),
            b.memory_gib.to_string(),
        ),
        ("Kubernetes", a.kubernetes.clone(), b.kubernetes.clone()),
        ("kube crate", a.kube_crate.clone(), b.kube_crate.clone()),
        (
            "real node",
            a.real_node.to_string(),
            b.real_node.to_string(),
        ),
    ];
    refuse_differences("machine", first, path, &differences)
}

/// Fails, naming the difference, unless two files measured with the same workload settings
/// (how many runs a count took may differ: the tables show it).
fn same_settings(first: &Path, a: &Settings, path: &Path, b: &Settings) -> anyhow::Result<()> {
    let differences = [
        (
            "--concurrency",
            a.concurrency.to_string(),
            b.concurrency.to_string(),
        ),
        (
            "--objects-per-namespace",
            a.objects_per_namespace.to_string(),
            b.objects_per_namespace.to_string(),
        ),
        ("--size", a.size.to_string(), b.size.to_string()),
        (
            "--max-concurrent-reconciles",
            a.max_concurrent_reconciles.to_string(),
            b.max_concurrent_reconciles.to_string(),
        ),
    ];
    refuse_differences("settings", first, path, &differences)
}

fn refuse_differences(
    what: &str,
    first: &Path,
    path: &Path,
    fields: &[(&str, String, String)],
) -> anyhow::Result<()> {
    let differing: Vec<String> = fields
        .iter()
        .filter(|(_, a, b)| a != b)
        .map(|(name, a, b)| format!("{name} {a} against {b}"))
        .collect();
    if differing.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "--report: {} and {} were measured with different {what}: {}",
        first.display(),
        path.display(),
        differing.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::tests::{recovery, results_of, run};
    use crate::bench::report::{Build, markdown};
    use crate::bench::{OURS, REFERENCE};

    fn build(manager: &str, digest: &str) -> Build {
        Build {
            manager: manager.to_owned(),
            digest: digest.to_owned(),
        }
    }

    /// Both managers at `count`, as one run of the bench measures them.
    fn both_at(count: usize) -> Results {
        Results {
            builds: vec![build(OURS, "sha256:aa"), build(REFERENCE, "sha256:bb")],
            ..results_of(vec![
                run(OURS, count, 2.0, 4.0, 1.0),
                run(REFERENCE, count, 4.0, 8.0, 4.0),
            ])
        }
    }

    fn error_of(parts: Vec<(PathBuf, Results)>) -> String {
        match merge(parts) {
            Ok(merged) => panic!("merged: {:?}", merged.sources),
            Err(error) => format!("{error:#}"),
        }
    }

    #[test]
    fn counts_and_phases_of_several_runs_print_as_one() {
        let small = both_at(100);
        let large = both_at(10_000);
        let phases = Results {
            recovery: vec![recovery()],
            ..results_of(Vec::new())
        };
        let merged = merge(vec![
            ("small.json".into(), small),
            ("large.json".into(), large),
            ("phases.json".into(), phases),
        ])
        .expect("merged");

        assert_eq!(
            merged.sources,
            [
                "small.json: 100 objects",
                "large.json: 10000 objects",
                "phases.json: recovery (its builds not recorded)",
            ]
        );
        assert_eq!(merged.results.runs.len(), 4);
        assert_eq!(merged.results.recovery.len(), 1);
        assert_eq!(
            merged.results.builds,
            [build(OURS, "sha256:aa"), build(REFERENCE, "sha256:bb")]
        );
        let text = markdown(&merged.results);
        assert!(
            text.contains("Builds: ours sha256:aa, controller-runtime sha256:bb."),
            "{text}"
        );
        // Each count's ratios, and ours' growth from 100 to 10,000.
        for row in [
            "| ours | 100 |",
            "| ours | 10000 |",
            "| ours | API server | 20 |",
        ] {
            assert!(text.contains(row), "{row} not in {text}");
        }
    }

    #[test]
    fn one_file_reads_as_itself() {
        let merged = merge(vec![("one.json".into(), both_at(100))]).expect("merged");
        assert_eq!(merged.sources, ["one.json: 100 objects"]);
        assert_eq!(
            markdown(&merged.results),
            markdown(&both_at(100)),
            "nothing added or lost"
        );
    }

    #[test]
    fn a_count_measured_in_two_files_is_refused() {
        let error = error_of(vec![
            ("a.json".into(), both_at(100)),
            ("b.json".into(), both_at(100)),
        ]);
        assert!(
            error.contains("a.json and b.json each measured 100 objects"),
            "{error}"
        );
        // Also when each file holds one of the managers: their ratio would span two runs.
        let ours = Results {
            builds: vec![build(OURS, "sha256:aa"), build(REFERENCE, "sha256:bb")],
            ..results_of(vec![run(OURS, 100, 2.0, 4.0, 1.0)])
        };
        let reference = Results {
            runs: vec![run(REFERENCE, 100, 4.0, 8.0, 4.0)],
            ..ours.clone()
        };
        let error = error_of(vec![("a.json".into(), ours), ("b.json".into(), reference)]);
        assert!(
            error.contains("a.json and b.json each measured 100 objects"),
            "{error}"
        );
    }

    #[test]
    fn a_count_measured_for_some_managers_gives_way_to_one_measured_for_all() {
        // A run stopped after ours' 10,000, from before builds were recorded.
        let stopped = results_of(vec![
            run(OURS, 100, 2.0, 4.0, 1.0),
            run(REFERENCE, 100, 4.0, 8.0, 4.0),
            run(OURS, 10_000, 200.0, 4.0, 100.0),
        ]);
        let merged = merge(vec![
            ("stopped.json".into(), stopped),
            ("large.json".into(), both_at(10_000)),
        ])
        .expect("merged");
        assert_eq!(
            merged.sources,
            [
                "stopped.json: 100 objects; 10000 objects left out, measured there for only some of its managers and in large.json for every one (its builds not recorded)",
                "large.json: 10000 objects",
            ]
        );
        let taken: Vec<(&str, usize, f64)> = merged
            .results
            .runs
            .iter()
            .map(|r| (r.manager.as_str(), r.objects, r.convergence.seconds))
            .collect();
        assert_eq!(
            taken,
            [
                (OURS, 100, 2.0),
                (REFERENCE, 100, 4.0),
                (OURS, 10_000, 2.0),
                (REFERENCE, 10_000, 4.0),
            ],
            "the stopped run's 10,000 is left out"
        );

        // Two files each with some of a count's managers: neither gives way.
        let ours_only = Results {
            builds: vec![build(OURS, "sha256:aa"), build(REFERENCE, "sha256:bb")],
            ..results_of(vec![run(OURS, 10_000, 200.0, 4.0, 100.0)])
        };
        let error = error_of(vec![
            ("a.json".into(), ours_only.clone()),
            ("b.json".into(), ours_only),
        ]);
        assert!(
            error.contains("a.json and b.json each measured 10000 objects"),
            "{error}"
        );
    }

    #[test]
    fn the_recovery_of_two_files_is_refused() {
        let with_recovery = || Results {
            recovery: vec![recovery()],
            ..results_of(Vec::new())
        };
        let error = error_of(vec![
            ("a.json".into(), with_recovery()),
            ("b.json".into(), with_recovery()),
        ]);
        assert!(
            error.contains("both a.json and b.json measured the recovery"),
            "{error}"
        );
    }

    #[test]
    fn another_build_of_a_manager_is_refused() {
        let mut rebuilt = both_at(10_000);
        rebuilt.builds[0].digest = "sha256:cc".to_owned();
        let error = error_of(vec![
            ("a.json".into(), both_at(100)),
            ("b.json".into(), rebuilt),
        ]);
        assert!(
            error.contains(
                "b.json measured another build of ours (sha256:cc) than an earlier file (sha256:aa)"
            ),
            "{error}"
        );
    }

    #[test]
    fn other_settings_or_another_machine_are_refused_by_name() {
        let mut other_size = both_at(10_000);
        other_size.settings.size = 3;
        let error = error_of(vec![
            ("a.json".into(), both_at(100)),
            ("b.json".into(), other_size),
        ]);
        assert!(
            error.contains(
                "a.json and b.json were measured with different settings: --size 1 against 3"
            ),
            "{error}"
        );

        let mut other_machine = both_at(10_000);
        other_machine.machine.cores = 4;
        other_machine.machine.real_node = true;
        let error = error_of(vec![
            ("a.json".into(), both_at(100)),
            ("b.json".into(), other_machine),
        ]);
        assert!(
            error.contains("different machine: cores 2 against 4, real node false against true"),
            "{error}"
        );
    }

    #[test]
    fn each_file_names_its_kernel_when_they_differ() {
        let mut other_kernel = both_at(10_000);
        other_kernel.machine.kernel = "k2".into();
        let merged = merge(vec![
            ("a.json".into(), both_at(100)),
            ("b.json".into(), other_kernel),
        ])
        .expect("merged");
        assert_eq!(
            merged.sources,
            [
                "a.json: 100 objects (on k; r)",
                "b.json: 10000 objects (on k2; r)",
            ]
        );
        let text = markdown(&merged.results);
        assert!(
            text.contains("Machine: 2 cores, 24 GiB, k or k2; r;"),
            "{text}"
        );
    }

    #[test]
    fn a_file_without_results_is_named() {
        let error = error_of(vec![
            ("a.json".into(), both_at(100)),
            ("empty.json".into(), results_of(Vec::new())),
        ]);
        assert!(
            error.contains("empty.json holds no finished run, recovery or failover"),
            "{error}"
        );
    }
}
