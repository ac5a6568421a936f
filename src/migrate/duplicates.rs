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
    pub groups: Vec<DuplicateGroup>,
}

impl fmt::Display for DuplicateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} group(s) of duplicates block unique index {} on {}:",
            self.groups.len(),
            self.index,
            self.collection
        )?;
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
    let mut group_id = Document::new();
    for (i, field) in index.keys.keys().enumerate() {
        group_id.insert(format!("k{i}"), format!("${field}"));
    }
    let mut pipeline = Vec::new();
    if let Some(partial) = &index.partial_filter_expression {
        pipeline.push(doc! { "$match": partial.clone() });
    }
    pipeline.extend([
        doc! { "$group": { "_id": group_id, "count": { "$sum": 1 }, "ids": { "$push": "$_id" } } },
        doc! { "$match": { "count": { "$gt": 1 } } },
        doc! { "$sort": { "count": -1 } },
        doc! { "$limit": REPORT_LIMIT },
    ]);
    let cursor = store
        .collection(&index.collection)
        .aggregate(pipeline)
        .allow_disk_use(true)
        .await?;
    let rows: Vec<Document> = cursor.try_collect().await?;
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
    })
}
