//! Finds documents that would violate a unique index before it is created, so that the
//! operator gets a report naming the offending groups instead of a raw E11000.

use std::fmt;

use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc};

use super::IndexStep;
use crate::store::{Store, StoreError};

/// How many offending groups (and ids per group) a report lists.
const REPORT_LIMIT: i64 = 20;
const IDS_PER_GROUP: usize = 5;

/// Documents sharing one value of a unique index's key.
#[derive(Debug, Clone)]
pub struct DuplicateGroup {
    pub key: Document,
    pub count: i64,
    pub sample_ids: Vec<Bson>,
}

/// The duplicates found for one unique index.
#[derive(Debug, Clone)]
pub struct DuplicateReport {
    pub collection: String,
    pub index: String,
    /// The largest groups, at most `REPORT_LIMIT` of them.
    pub groups: Vec<DuplicateGroup>,
    /// How many groups there are in all.
    pub total: i64,
}

impl fmt::Display for DuplicateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} group(s) of duplicates block unique index {} on {}",
            self.total, self.index, self.collection
        )?;
        if self.total > self.groups.len() as i64 {
            write!(f, "; the {} largest", self.groups.len())?;
        }
        writeln!(f, ":")?;
        for group in &self.groups {
            let ids: Vec<String> = group.sample_ids.iter().map(|id| id.to_string()).collect();
            writeln!(
                f,
                "  {} x {}  (_id: {})",
                group.count,
                group.key,
                ids.join(", ")
            )?;
        }
        write!(
            f,
            "Resolve them (keep one document per group), then run `tokenmint migrate` again."
        )
    }
}

/// Groups of documents in `index.collection` that share the index's key.
pub async fn find_duplicates(
    store: &Store,
    index: &IndexStep,
) -> Result<DuplicateReport, StoreError> {
    // Group on each key field; field paths like `origin.provider` become `$origin.provider`.
    // A unique index keys a missing field as null, so missing and null are one value here
    // too (`$ifNull`); grouped on the bare path, a missing field would leave its key out
    // and two documents the index refuses together would stand in different groups.
    let mut group_id = Document::new();
    for (i, field) in index.keys.keys().enumerate() {
        group_id.insert(
            format!("k{i}"),
            doc! { "$ifNull": [format!("${field}"), Bson::Null] },
        );
    }
    let mut pipeline = Vec::new();
    if let Some(partial) = &index.partial_filter_expression {
        pipeline.push(doc! { "$match": partial.clone() });
    }
    pipeline.extend([
        doc! { "$group": { "_id": group_id, "count": { "$sum": 1 }, "ids": { "$push": "$_id" } } },
        doc! { "$match": { "count": { "$gt": 1 } } },
        // The facet's answer is one document: a few ids a group, not all of them.
        doc! { "$project": { "count": 1, "ids": { "$slice": ["$ids", IDS_PER_GROUP as i32] } } },
        doc! { "$facet": {
            "largest": [{ "$sort": { "count": -1 } }, { "$limit": REPORT_LIMIT }],
            "all": [{ "$count": "groups" }],
        } },
    ]);
    let cursor = store
        .collection(&index.collection)
        .aggregate(pipeline)
        .allow_disk_use(true)
        .await?;
    let faceted: Vec<Document> = cursor.try_collect().await?;
    let faceted = faceted.into_iter().next().unwrap_or_default();
    let total = faceted
        .get_array("all")
        .ok()
        .and_then(|all| all.first())
        .and_then(Bson::as_document)
        .and_then(|all| {
            all.get_i32("groups")
                .map(i64::from)
                .or_else(|_| all.get_i64("groups"))
                .ok()
        })
        .unwrap_or(0);
    let rows: Vec<Document> = faceted
        .get_array("largest")
        .map(|rows| rows.iter().filter_map(Bson::as_document).cloned().collect())
        .unwrap_or_default();
    let field_names: Vec<&String> = index.keys.keys().collect();
    let groups = rows
        .into_iter()
        .map(|row| {
            let grouped = row.get_document("_id").cloned().unwrap_or_default();
            // Report the key under its real field names, not k0, k1, ...
            let key = field_names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    (
                        (*name).clone(),
                        grouped.get(format!("k{i}")).cloned().unwrap_or(Bson::Null),
                    )
                })
                .collect();
            let count = row
                .get("count")
                .and_then(Bson::as_i64)
                .or_else(|| row.get_i32("count").ok().map(i64::from))
                .unwrap_or(0);
            let sample_ids = row
                .get_array("ids")
                .map(|ids| ids.iter().take(IDS_PER_GROUP).cloned().collect())
                .unwrap_or_default();
            DuplicateGroup {
                key,
                count,
                sample_ids,
            }
        })
        .collect();
    Ok(DuplicateReport {
        collection: index.collection.clone(),
        index: index.name.clone(),
        groups,
        total,
    })
}
