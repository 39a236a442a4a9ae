//! The hash space that sharded replicas split between them.
//!
//! An object belongs to the slot its uid hashes to: the 64-bit FNV-1a hash of
//! `metadata.uid`, the hash the API server's `shardRange(object.metadata.uid, …)` selector
//! uses (KEP-5866), so a replica that filters its cache and one the API server filters for see
//! the same objects. The space is cut into [`SLOT_COUNT`] equal slots: few enough that a set of
//! them is one machine word, and a replica's share is a handful of ranges for the API server;
//! enough that up to 64 replicas each get a share, within one slot of the others.
//!
//! Children follow their owner: a child's trigger names its owner, whose uid decides.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// How many slots the hash space is cut into.
pub const SLOT_COUNT: u8 = 64;

/// How far a hash is shifted to give its slot: the top 6 bits pick one of 64.
const SLOT_SHIFT: u32 = 64 - SLOT_COUNT.trailing_zeros();

/// The 64-bit FNV-1a hash of `value`, as the API server's `shardRange` computes it.
pub fn fnv1a_64(value: &str) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    value.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

/// The slot an object of this uid belongs to.
pub fn slot_of_uid(uid: &str) -> u8 {
    // The shift leaves 6 bits, so the value fits.
    u8::try_from(fnv1a_64(uid) >> SLOT_SHIFT).unwrap_or(SLOT_COUNT - 1)
}

/// A set of slots.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Slots(u64);

impl Slots {
    /// No slot.
    pub const NONE: Slots = Slots(0);
    /// Every slot: the whole hash space.
    pub const ALL: Slots = Slots(u64::MAX);

    /// The set of the one slot `slot`; none when it is out of range.
    pub fn one(slot: u8) -> Self {
        Self::NONE.with(slot)
    }

    /// This set and `slot`.
    #[must_use]
    pub fn with(self, slot: u8) -> Self {
        match 1u64.checked_shl(u32::from(slot)) {
            Some(bit) if slot < SLOT_COUNT => Self(self.0 | bit),
            _ => self,
        }
    }

    /// Whether `slot` is in the set.
    pub fn contains(self, slot: u8) -> bool {
        slot < SLOT_COUNT && self.0 & (1u64 << slot) != 0
    }

    /// Whether the object of this uid belongs to a slot of the set.
    pub fn contains_uid(self, uid: &str) -> bool {
        self.contains(slot_of_uid(uid))
    }

    /// How many slots the set holds.
    pub fn len(self) -> u32 {
        self.0.count_ones()
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The slots of both sets.
    #[must_use]
    pub fn union(self, other: Slots) -> Slots {
        Slots(self.0 | other.0)
    }

    /// The slots of this set that `other` lacks.
    #[must_use]
    pub fn without(self, other: Slots) -> Slots {
        Slots(self.0 & !other.0)
    }

    /// The slots both sets hold.
    #[must_use]
    pub fn intersection(self, other: Slots) -> Slots {
        Slots(self.0 & other.0)
    }

    /// The slots of the set, lowest first.
    pub fn iter(self) -> impl Iterator<Item = u8> {
        (0..SLOT_COUNT).filter(move |slot| self.contains(*slot))
    }

    /// The set as runs of adjacent slots, `(first, last)` inclusive, lowest first.
    fn runs(self) -> Vec<(u8, u8)> {
        let mut runs: Vec<(u8, u8)> = Vec::new();
        for slot in self.iter() {
            match runs.last_mut() {
                Some((_, last)) if *last + 1 == slot => *last = slot,
                _ => runs.push((slot, slot)),
            }
        }
        runs
    }

    /// The hash ranges the set covers, adjacent slots merged.
    pub fn ranges(self) -> Vec<HashRange> {
        let start_of = |slot: u8| u128::from(slot) << SLOT_SHIFT;
        self.runs()
            .into_iter()
            .map(|(first, last)| HashRange {
                start: start_of(first),
                end: start_of(last + 1),
            })
            .collect()
    }

    /// The API server's shard selector for the objects of this set (`ListOptions.shardSelector`):
    /// `None` for every slot (no selector needed) and for none (nothing to ask for).
    pub fn uid_selector(self) -> Option<String> {
        if self == Slots::ALL || self.is_empty() {
            return None;
        }
        let ranges: Vec<String> = self.ranges().iter().map(HashRange::uid_selector).collect();
        Some(ranges.join(" || "))
    }

    /// The label selector of the children whose owners belong to this set: their
    /// [`crate::labels::SHARD_SLOT`] is one of its slots. `None` for every slot (no selector
    /// needed) and for none (nothing to ask for).
    pub fn label_selector(self) -> Option<String> {
        if self == Slots::ALL || self.is_empty() {
            return None;
        }
        let slots: Vec<String> = self.iter().map(|slot| slot.to_string()).collect();
        Some(format!(
            "{} in ({})",
            crate::labels::SHARD_SLOT,
            slots.join(",")
        ))
    }
}

impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Slots({self})")
    }
}

/// Runs of slots, as in `0-20,42,60-63`; `-` for none.
impl fmt::Display for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let runs: Vec<String> = self
            .runs()
            .into_iter()
            .map(|(first, last)| {
                if first == last {
                    first.to_string()
                } else {
                    format!("{first}-{last}")
                }
            })
            .collect();
        f.write_str(&runs.join(","))
    }
}

/// What is wrong with a set of slots written as text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{text}` is not a set of slots (runs such as `0-20,42` of slots 0 to 63, or `-`): {reason}"
)]
pub struct ParseSlotsError {
    text: String,
    reason: &'static str,
}

impl FromStr for Slots {
    type Err = ParseSlotsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |reason| ParseSlotsError {
            text: text.to_owned(),
            reason,
        };
        if text.trim() == "-" {
            return Ok(Slots::NONE);
        }
        let slot = |s: &str| {
            let slot: u8 = s.trim().parse().map_err(|_| error("not a number"))?;
            if slot < SLOT_COUNT {
                Ok(slot)
            } else {
                Err(error("a slot past 63"))
            }
        };
        let mut slots = Slots::NONE;
        for run in text.split(',') {
            let (first, last) = match run.split_once('-') {
                Some((first, last)) => (slot(first)?, slot(last)?),
                None => (slot(run)?, slot(run)?),
            };
            if first > last {
                return Err(error("a run that ends before it starts"));
            }
            slots = (first..=last).fold(slots, Slots::with);
        }
        Ok(slots)
    }
}

/// A range of the hash space, `start` inclusive and `end` exclusive (up to 2⁶⁴).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashRange {
    /// The first hash of the range.
    pub start: u128,
    /// The first hash past the range.
    pub end: u128,
}

impl HashRange {
    /// The range as a `shardRange` of the objects' uids, bounds written as the API server's
    /// documentation writes them (16 hex digits, `0x10000000000000000` for the end of the space).
    pub fn uid_selector(&self) -> String {
        format!(
            "shardRange(object.metadata.uid, '0x{:016x}', '0x{:016x}')",
            self.start, self.end
        )
    }
}

/// Which slots each member is to own, given every member's identity and who holds which
/// slots now (members that left included): each gets `SLOT_COUNT / members` slots or one
/// more, and only the slots that must move do.
///
/// - The members holding the most now get the larger shares, so no member that is at its
///   share gives anything up.
/// - Each member keeps what it holds up to its share: the slots it ranks highest on, ranking
///   by a hash of the member's identity and the slot (rendezvous hashing).
/// - The rest (slots held by no member, by one that left, or beyond a member's share) go to
///   the members below their share, each to the member that ranks highest on it among them.
///
/// So the result depends only on the identities and the holdings, never on their order or
/// on who computes it; and once every member holds its share, computing it again changes
/// nothing. Identities repeated count once; empty ones own nothing.
pub fn assign<S: AsRef<str>>(
    members: &[S],
    holding: &BTreeMap<String, Slots>,
) -> BTreeMap<String, Slots> {
    let mut members: Vec<&str> = members
        .iter()
        .map(AsRef::as_ref)
        .filter(|member| !member.is_empty())
        .collect();
    members.sort_unstable();
    members.dedup();
    let held = |member: &str| holding.get(member).copied().unwrap_or_default();
    let count = members.len();
    let mut shares: BTreeMap<String, Slots> = BTreeMap::new();
    if count == 0 {
        return shares;
    }
    let (base, extra) = (
        usize::from(SLOT_COUNT) / count,
        usize::from(SLOT_COUNT) % count,
    );
    let mut by_holding = members.clone();
    by_holding.sort_by_key(|member| (std::cmp::Reverse(held(member).len()), *member));
    let rank = |member: &str, slot: u8| rank(member, slot);
    let mut taken = Slots::NONE;
    let mut room: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, member) in by_holding.iter().enumerate() {
        let share_len = base + usize::from(i < extra);
        // Another member's claim on a slot (holdings that overlap) never makes it this one's.
        let mut kept: Vec<u8> = held(member).without(taken).iter().collect();
        kept.sort_by_key(|slot| std::cmp::Reverse(rank(member, *slot)));
        kept.truncate(share_len);
        let share = kept.into_iter().fold(Slots::NONE, Slots::with);
        taken = taken.union(share);
        room.insert(member, share_len - share.len() as usize);
        shares.insert((*member).to_owned(), share);
    }
    let mut free: Vec<(u64, &str, u8)> = room
        .iter()
        .filter(|(_, room)| **room > 0)
        .flat_map(|(member, _)| {
            Slots::ALL
                .without(taken)
                .iter()
                .map(move |slot| (rank(member, slot), *member, slot))
        })
        .collect();
    free.sort_unstable_by(|a, b| b.cmp(a));
    for (_, member, slot) in free {
        let left = room.get_mut(member);
        if let Some(left) = left.filter(|left| **left > 0 && !taken.contains(slot)) {
            *left -= 1;
            taken = taken.with(slot);
            if let Some(share) = shares.get_mut(member) {
                *share = share.with(slot);
            }
        }
    }
    shares
}

/// How strongly `member` wants `slot`. FNV's last bytes barely reach its high bits, so the
/// hash is mixed further (MurmurHash3's finalizer) before it is compared.
fn rank(member: &str, slot: u8) -> u64 {
    let mut hash = fnv1a_64(&format!("{member}/{slot}"));
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_uids_as_the_api_server_does() {
        // Reference values of FNV-1a 64 (the empty string is the offset basis).
        assert_eq!(fnv1a_64(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64("foobar"), 0x85944171f73967e8);
        let uid = "0d9f2bd2-6c64-4c8e-8d38-3f1f6a4e2a51";
        assert_eq!(
            u64::from(slot_of_uid(uid)),
            fnv1a_64(uid) >> 58,
            "the slot is the hash's top six bits"
        );
    }

    #[test]
    fn slots_merge_into_ranges_and_selectors() {
        let slots: Slots = "0-1,3,63".parse().expect("slots");
        assert_eq!(slots.len(), 4);
        assert_eq!(slots.to_string(), "0-1,3,63");
        assert_eq!(
            slots.ranges(),
            vec![
                HashRange {
                    start: 0,
                    end: 0x0800_0000_0000_0000
                },
                HashRange {
                    start: 0x0c00_0000_0000_0000,
                    end: 0x1000_0000_0000_0000
                },
                HashRange {
                    start: 0xfc00_0000_0000_0000,
                    end: 1 << 64
                },
            ]
        );
        assert_eq!(
            slots.uid_selector().expect("a selector"),
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x0800000000000000') || \
             shardRange(object.metadata.uid, '0x0c00000000000000', '0x1000000000000000') || \
             shardRange(object.metadata.uid, '0xfc00000000000000', '0x10000000000000000')"
        );
        assert_eq!(Slots::ALL.uid_selector(), None);
        assert_eq!(Slots::NONE.uid_selector(), None);
        assert_eq!(
            slots.label_selector().expect("a selector"),
            "kube-operator-runtime/shard-slot in (0,1,3,63)"
        );
        assert_eq!(Slots::ALL.label_selector(), None);
        assert_eq!(Slots::NONE.label_selector(), None);
        assert_eq!(Slots::ALL.to_string(), "0-63");
        assert_eq!("-".parse::<Slots>(), Ok(Slots::NONE));
        assert_eq!(Slots::NONE.to_string(), "-");
    }

    #[test]
    fn bad_slot_text_is_refused_with_the_reason() {
        for (text, reason) in [
            ("64", "past 63"),
            ("3-1", "ends before"),
            ("a", "not a number"),
            ("", "not a number"),
            ("1,,2", "not a number"),
        ] {
            let error = text.parse::<Slots>().expect_err(text).to_string();
            assert!(error.contains(reason), "{text}: {error}");
            assert!(error.contains(&format!("`{text}`")), "{error}");
        }
        assert!(!Slots::NONE.with(64).contains(64));
    }

    /// Members joining one by one, each round settling (every member holding its share).
    fn settled(members: &[String]) -> BTreeMap<String, Slots> {
        let mut holding = BTreeMap::new();
        for count in 1..=members.len() {
            holding = assign(&members[..count], &holding);
        }
        holding
    }

    #[test]
    fn every_slot_goes_to_exactly_one_member_in_even_shares() {
        for count in 1..=9 {
            let members: Vec<String> = (0..count).map(|i| format!("manager-{i}")).collect();
            for owned in [assign(&members, &BTreeMap::new()), settled(&members)] {
                assert_eq!(owned.len(), count);
                let all = owned.values().fold(Slots::NONE, |all, slots| {
                    assert!(all.intersection(*slots).is_empty(), "a slot owned twice");
                    all.union(*slots)
                });
                assert_eq!(all, Slots::ALL, "{count} members");
                for slots in owned.values() {
                    let len = slots.len() as usize;
                    assert!(len == 64 / count || len == 64 / count + 1, "{owned:?}");
                }
            }
        }
        assert!(assign::<&str>(&[], &BTreeMap::new()).is_empty());
    }

    #[test]
    fn the_assignment_depends_on_the_members_not_their_order() {
        let holding = settled(&["a".to_owned(), "b".to_owned()]);
        let forward = assign(&["a", "b", "c"], &holding);
        let backward = assign(&["c", "b", "a", "a", ""], &holding);
        assert_eq!(forward, backward);
        assert_eq!(assign(&["c", "b", "a"], &forward), forward, "settled");
    }

    #[test]
    fn only_the_slots_that_must_move_do() {
        for count in 1..=8 {
            let members: Vec<String> = (0..count).map(|i| format!("pod-{i}")).collect();
            let before = settled(&members);
            let mut grown = members.clone();
            grown.push("newcomer".to_owned());
            let after = assign(&grown, &before);
            // Only the newcomer's share moves, each slot of it from one that had more.
            let lost: u32 = members
                .iter()
                .map(|m| before[m].without(after[m]).len())
                .sum();
            let gained: u32 = members
                .iter()
                .map(|m| after[m].without(before[m]).len())
                .sum();
            assert_eq!(gained, 0, "{count} members: nothing moves between them");
            assert_eq!(lost, after["newcomer"].len());
            // One leaving: its share goes out, the others keep theirs.
            let left = assign(&grown[1..], &after);
            for m in &grown[1..] {
                assert!(after[m].without(left[m]).is_empty(), "{m} gave up a slot");
            }
            assert_eq!(assign(&grown[1..], &left), left, "settled");
        }
    }

    #[test]
    fn overlapping_holdings_give_a_slot_once() {
        let holding = BTreeMap::from([
            ("a".to_owned(), Slots::ALL),
            ("b".to_owned(), "0-40".parse().expect("slots")),
        ]);
        let owned = assign(&["a", "b"], &holding);
        assert!(owned["a"].intersection(owned["b"]).is_empty());
        assert_eq!(owned["a"].union(owned["b"]), Slots::ALL);
    }
}
