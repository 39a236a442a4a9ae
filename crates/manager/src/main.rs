//! The manager binary: runs every enabled controller behind leader election.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("the manager is not assembled yet")
}
