//! The results of several runs of the bench, reported as one.
//!
//! The whole check (three object counts for two managers, then recovery and
//! failover) can take longer than one sitting, so it can be measured a part at a time, e.g.
//! `--objects 100,1000 --phases workload`, `--objects 10000 --phases workload`, then
//! `--objects 10000 --phases recovery,failover`, and `--report` given the three files prints
//! them as one. What compares managers still comes from one run: each object count's runs,
//! the recovery and the failover are taken whole from one file. The files must hold the same
//! builds (by their binaries' digests, where recorded), measured on the same kind of machine
//! and cluster with the same settings; anything else is refused, naming what differs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::report::{Machine, Results, Settings};

/// Results read from several files, and what was taken from each.
pub struct Merged {
    pub results: Results,
    /// One line per file: its path and what it measured.
    pub sources: Vec<String>,
}

/// Joins the results of `parts` (each a file's path and its contents), in the order given.
pub fn merge(parts: Vec<(PathBuf, Results)>) -> anyhow::Result<Merged> {
    let mut parts = parts.into_iter();
    let Some((first_path, first)) = parts.next() else {
        anyhow::bail!("--report: no results file given");
    };
    let mut merged = Results {
        builds: Vec::new(),
        runs: Vec::new(),
        recovery: Vec::new(),
        failover: Vec::new(),
        ..first.clone()
    };
    let mut counts_from: Vec<(usize, PathBuf)> = Vec::new();
    let mut recovery_from: Option<PathBuf> = None;
    let mut failover_from: Option<PathBuf> = None;
    let mut sources = Vec::new();
    for (path, results) in std::iter::once((first_path.clone(), first)).chain(parts) {
        same_machine(&first_path, &merged.machine, &path, &results.machine)?;
        same_settings(&first_path, &merged.settings, &path, &results.settings)?;
        for build in &results.builds {
            match merged.builds.iter().find(|b| b.manager == build.manager) {
                Some(known) if known.digest != build.digest => anyhow::bail!(
                    "--report: {} measured another build of {} ({}) than an earlier file ({}); results of different builds do not make one run",
                    path.display(),
                    build.manager,
                    build.digest,
                    known.digest
                ),
                Some(_) => {}
                None => merged.builds.push(build.clone()),
            }
        }
        let counts: BTreeSet<usize> = results.runs.iter().map(|run| run.objects).collect();
        for &count in &counts {
            if let Some((_, earlier)) = counts_from.iter().find(|(c, _)| *c == count) {
                anyhow::bail!(
                    "--report: both {} and {} measured {count} objects; a count's ratios compare the runs of one bench, so give only one of them",
                    earlier.display(),
                    path.display()
                );
            }
            counts_from.push((count, path.clone()));
        }
        taken_once(
            "the recovery",
            &mut recovery_from,
            &path,
            !results.recovery.is_empty(),
        )?;
        taken_once(
            "the failover",
            &mut failover_from,
            &path,
            !results.failover.is_empty(),
        )?;
        let measured = what_was_measured(&counts, &results);
        if measured.is_empty() {
            anyhow::bail!(
                "--report: {} holds no finished run, recovery or failover; leave it out",
                path.display()
            );
        }
        sources.push(format!(
            "{}: {}{}",
            path.display(),
            measured.join(", "),
            if results.builds.is_empty() {
                " (its builds not recorded)"
            } else {
                ""
            }
        ));
        merged.runs.extend(results.runs);
        merged.recovery.extend(results.recovery);
        merged.failover.extend(results.failover);
    }
    Ok(Merged {
        results: merged,
        sources,
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

/// What a file measured, as the list of its sources line.
fn what_was_measured(counts: &BTreeSet<usize>, results: &Results) -> Vec<String> {
    let mut measured: Vec<String> = counts
        .iter()
        .map(|count| format!("{count} objects"))
        .collect();
    if !results.recovery.is_empty() {
        measured.push("recovery".to_owned());
    }
    if !results.failover.is_empty() {
        measured.push("failover".to_owned());
    }
    measured
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
            error.contains("both a.json and b.json measured 100 objects"),
            "{error}"
        );
        // Also when each file holds one of the managers: their ratio would span two runs.
        let ours = results_of(vec![run(OURS, 100, 2.0, 4.0, 1.0)]);
        let reference = results_of(vec![run(REFERENCE, 100, 4.0, 8.0, 4.0)]);
        let error = error_of(vec![("a.json".into(), ours), ("b.json".into(), reference)]);
        assert!(error.contains("measured 100 objects"), "{error}");
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
