//! [`NodeName`]: a node's name or address, shared between the topology and every session
//! that keeps which node it is on (issue 22: memory per idle session). A session holds the
//! topology's allocation, not a copy of its own.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NodeName(Arc<str>);

impl NodeName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for NodeName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for NodeName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for NodeName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for NodeName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for NodeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(NodeName::from)
    }
}

impl From<&str> for NodeName {
    fn from(s: &str) -> Self {
        NodeName(Arc::from(s))
    }
}

impl From<String> for NodeName {
    fn from(s: String) -> Self {
        NodeName(Arc::from(s))
    }
}

impl From<&String> for NodeName {
    fn from(s: &String) -> Self {
        NodeName(Arc::from(s.as_str()))
    }
}

impl From<NodeName> for String {
    fn from(n: NodeName) -> Self {
        n.0.to_string()
    }
}

impl PartialEq<str> for NodeName {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for NodeName {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for NodeName {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<NodeName> for str {
    fn eq(&self, other: &NodeName) -> bool {
        *self == *other.0
    }
}

impl PartialEq<NodeName> for &str {
    fn eq(&self, other: &NodeName) -> bool {
        **self == *other.0
    }
}

impl PartialEq<NodeName> for String {
    fn eq(&self, other: &NodeName) -> bool {
        **self == *other.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_shares_the_text_and_compares_as_text() {
        let name = NodeName::from("node2");
        let kept = name.clone();
        assert!(std::ptr::eq(name.as_str(), kept.as_str()));
        assert_eq!(kept, "node2");
        assert_eq!("node2", kept);
        assert_eq!(kept, String::from("node2"));
        assert_ne!(kept, NodeName::from("node3"));
        assert_eq!(format!("{kept} {kept:?}"), "node2 \"node2\"");
        assert_eq!(
            serde_json::to_string(&kept).ok().as_deref(),
            Some("\"node2\"")
        );
        let read: Option<NodeName> = serde_json::from_str("\"node2\"").ok();
        assert_eq!(read, Some(kept.clone()));
        // What a session holds for it: a pointer and a length.
        assert_eq!(std::mem::size_of::<NodeName>(), 16);
    }
}
