//! The fork tree of a session: its ancestors (header `parent_id`, as far as they are
//! still in the root as those parents: `Root::parent_in_root`), its parent's other forks
//! and its own forks, each edge labelled with the fork point, read through the public API
//! (`Root::catalog_entry`, `SessionReader::dependents`, `lineage` and `turns_overlapping`).

use std::collections::BTreeMap;

use serde::Serialize;
use session_store::{CatalogEntry, Origin, Root, SessionId};

use super::App;
use super::data::{blocking, current_writer, of_session};
use super::problem::Problem;

/// Sessions a fork tree shows at most.
const MAX_TREE_NODES: usize = 200;
/// Ancestors a fork tree follows at most.
const MAX_ANCESTORS: usize = 64;

/// How a session of a fork tree relates to the session it is drawn for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Relation {
    /// A parent, grandparent, ….
    Ancestor,
    /// The session the tree is drawn for.
    Focus,
    /// Another fork of the same parent.
    Sibling,
    /// A fork of the session, or of one of its forks.
    Descendant,
}

/// A session of a fork tree.
#[derive(Debug, Serialize)]
pub struct TreeNode {
    /// The session.
    pub session_id: SessionId,
    /// Its title ("" when it has none).
    pub title: String,
    /// How it came to be.
    pub origin: Origin,
    /// Its relation to the focus.
    pub relation: Relation,
    /// Forks between it and the oldest ancestor drawn (0 for that one).
    pub generation: usize,
    /// Whether a writer holds it now.
    pub live: bool,
}

/// A fork: the child inherits its parent's events through `through_sequence`.
#[derive(Debug, Serialize)]
pub struct TreeEdge {
    /// The parent session.
    pub parent: SessionId,
    /// The fork (or rewind).
    pub child: SessionId,
    /// The last inherited sequence.
    pub through_sequence: u64,
    /// Where it was cut: `after turn-2`, `before turn-3` (or `at seq N`).
    pub label: String,
}

/// A session's ancestors, siblings and descendants.
#[derive(Debug, Serialize)]
pub struct ForkTree {
    /// The session the tree is drawn for.
    pub focus: SessionId,
    /// The sessions: ancestors oldest first, then the focus, siblings and descendants.
    pub nodes: Vec<TreeNode>,
    /// One per node but the oldest.
    pub edges: Vec<TreeEdge>,
    /// Whether forks were left out past the size limit.
    pub truncated: bool,
}

/// The fork tree of `id`.
pub async fn tree(app: &App, id: SessionId) -> Result<ForkTree, Problem> {
    of_session(app, &id, || {
        let (root, id) = (app.root.clone(), id.clone());
        blocking(move || build_tree(&root, id))
    })
    .await
}

/// A direct fork of a session: its id, catalog entry and last inherited sequence.
type Child = (SessionId, CatalogEntry, u64);

/// The sessions forked directly from `parent`, with the label of each fork point. A fork
/// is recorded as a dependent by every file it inherits from, which need not be its
/// parent's own (a fork of a fork that inherits only the grandparent's events): the
/// dependents of the parent and of its ancestors whose header names `parent` are its
/// forks, each cut at the highest sequence recorded.
fn children(root: &Root, parent: &SessionId) -> session_store::Result<Vec<(Child, String)>> {
    let reader = root.open_reader(parent)?;
    let mut cut: BTreeMap<SessionId, u64> = BTreeMap::new();
    let mut record = |dependents: Vec<session_store::DependentFork>| {
        for d in dependents {
            let through = cut.entry(d.child_id).or_default();
            *through = (*through).max(d.through_seq);
        }
    };
    record(reader.dependents()?);
    for ancestor in reader.lineage() {
        match root.open_reader(&ancestor.ancestor_id) {
            Ok(r) => record(r.dependents()?),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    let mut out = Vec::new();
    for (child, through) in cut {
        let entry = match root.catalog_entry(&child) {
            Ok(entry) => entry,
            Err(e) if e.is_not_found() => continue,
            Err(e) => return Err(e),
        };
        if entry.parent_id.as_ref() != Some(parent) {
            continue;
        }
        let turns = reader.turns_overlapping(through, through.saturating_add(1))?;
        let label = match entry.origin {
            Origin::Rewind => turns
                .iter()
                .find(|t| t.start_sequence == through.saturating_add(1))
                .map(|t| format!("before {}", t.turn_id)),
            _ => turns
                .iter()
                .find(|t| t.boundary_sequence == through)
                .map(|t| format!("after {}", t.turn_id)),
        }
        .unwrap_or_else(|| format!("at seq {through}"));
        out.push(((child, entry, through), label));
    }
    Ok(out)
}

fn build_tree(root: &Root, focus: SessionId) -> session_store::Result<ForkTree> {
    // The ancestors, newest first, as far as they are in the root as those parents: a
    // session made under a deleted parent's id is no ancestor.
    let mut chain = vec![(focus.clone(), root.catalog_entry(&focus)?)];
    while chain.len() <= MAX_ANCESTORS {
        let Some((child, parent)) = chain
            .last()
            .and_then(|(id, e)| Some((id.clone(), e.parent_id.clone()?)))
        else {
            break;
        };
        if chain.iter().any(|(id, _)| *id == parent) {
            break;
        }
        match root.open_reader(&child) {
            Ok(reader) if root.parent_in_root(&reader)? => {}
            Ok(_) => break,
            Err(e) if e.is_not_found() => break,
            Err(e) => return Err(e),
        }
        match root.catalog_entry(&parent) {
            Ok(entry) => chain.push((parent, entry)),
            Err(e) if e.is_not_found() => break,
            Err(e) => return Err(e),
        }
    }
    chain.reverse();
    let focus_generation = chain.len() - 1;
    let mut tree = ForkTree {
        focus: focus.clone(),
        nodes: Vec::new(),
        edges: Vec::new(),
        truncated: false,
    };
    let node = |id: SessionId, entry: CatalogEntry, relation, generation| TreeNode {
        live: current_writer(root, &id).is_some(),
        session_id: id,
        title: entry.title,
        origin: entry.origin,
        relation,
        generation,
    };
    // Each ancestor's edge to the next one; the parent's other forks are siblings, as many
    // as the size limit leaves room for besides the ancestors and the focus.
    let room = MAX_TREE_NODES.saturating_sub(chain.len());
    let mut siblings = Vec::new();
    for generation in 0..focus_generation {
        let (parent, _) = &chain[generation];
        let next = &chain[generation + 1].0;
        for ((child, entry, through), label) in children(root, parent)? {
            let is_next = child == *next;
            if !is_next && generation + 1 == focus_generation && siblings.len() >= room {
                tree.truncated = true;
                continue;
            }
            if is_next || generation + 1 == focus_generation {
                tree.edges.push(TreeEdge {
                    parent: parent.clone(),
                    child: child.clone(),
                    through_sequence: through,
                    label,
                });
                if !is_next {
                    siblings.push(node(child, entry, Relation::Sibling, focus_generation));
                }
            }
        }
    }
    for (generation, (id, entry)) in chain.into_iter().enumerate() {
        let relation = if generation == focus_generation {
            Relation::Focus
        } else {
            Relation::Ancestor
        };
        tree.nodes.push(node(id, entry, relation, generation));
    }
    tree.nodes.extend(siblings);
    // The focus's forks, breadth first.
    let mut frontier = vec![(focus, focus_generation)];
    while let Some((parent, generation)) = frontier.pop() {
        for ((child, entry, through), label) in children(root, &parent)? {
            if tree.nodes.len() >= MAX_TREE_NODES {
                tree.truncated = true;
                return Ok(tree);
            }
            if tree.nodes.iter().any(|n| n.session_id == child) {
                continue;
            }
            tree.edges.push(TreeEdge {
                parent: parent.clone(),
                child: child.clone(),
                through_sequence: through,
                label,
            });
            frontier.insert(0, (child.clone(), generation + 1));
            tree.nodes
                .push(node(child, entry, Relation::Descendant, generation + 1));
        }
    }
    Ok(tree)
}
