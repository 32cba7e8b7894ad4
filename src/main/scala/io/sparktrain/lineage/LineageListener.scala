package io.sparktrain.lineage

import java.nio.charset.StandardCharsets
import java.security.MessageDigest
import java.util.concurrent.atomic.AtomicLong

import scala.collection.mutable

import org.apache.spark.internal.Logging
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.catalog.HiveTableRelation
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.execution.QueryExecution
import org.apache.spark.sql.execution.datasources.{FileIndex, HadoopFsRelation, InsertIntoHadoopFsRelationCommand,
  LogicalRelation, PartitioningAwareFileIndex}
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation
import org.apache.spark.sql.sources.DataSourceRegister
import org.apache.spark.sql.util.QueryExecutionListener
import org.json4s.JsonAST.{JArray, JObject, JValue}
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods.{compact, render}

/**
 * Records what each successful query read and wrote: the data lineage of a job.
 *
 * For every action (a `collect`, a `count`, a `write`...) it keeps one event: the file
 * sources the query read (format, root paths, number of files, bytes, and a digest of
 * the listing: path, length and modification time of every file), the catalog and
 * DataSource V2 tables it read, and the files it wrote (path, format, save mode).
 * No data is read: everything comes from the analyzed plan and the file index Spark
 * has already listed.
 *
 * Events are JSON strings in a bounded buffer shared by the JVM (the newest
 * `capacity` are kept), numbered from 1; `eventsSince(id)` returns the later ones
 * as one JSON array.  The Python side (`sparktrain.track.source_lineage`) registers
 * the listener on a session with `register`, and reads the events of one job.
 *
 * Register it yourself with `--conf spark.sql.queryExecutionListeners=io.sparktrain.lineage.LineageListener`
 * (the jar on the driver's class path: `--jars sparktrain-listener.jar`).
 */
class LineageListener extends QueryExecutionListener with Logging {

  override def onSuccess(funcName: String, qe: QueryExecution, durationNs: Long): Unit = {
    try {
      LineageListener.record(funcName, qe.analyzed, durationNs / 1000000L)
    } catch {
      // Lineage must never fail a query: a plan this listener does not understand is skipped.
      case e: Exception => logWarning(s"sparktrain lineage: could not read the plan of '$funcName': $e")
    }
  }

  override def onFailure(funcName: String, qe: QueryExecution, exception: Exception): Unit = ()
}

object LineageListener {
  /** The newest events kept. */
  val capacity: Int = 1000

  private val lastIdCounter = new AtomicLong(0L)
  private val buffer = mutable.Queue.empty[(Long, String)]
  private val registered = java.util.Collections.newSetFromMap(
    new java.util.WeakHashMap[SparkSession, java.lang.Boolean]())

  /** Register a listener on `session` unless one was registered by this method or by configuration. */
  def register(session: SparkSession): Boolean = registered.synchronized {
    val configured = session.conf.getOption("spark.sql.queryExecutionListeners")
      .exists(_.split(",").map(_.trim).contains(classOf[LineageListener].getName))
    if (configured || registered.contains(session)) {
      false
    } else {
      session.listenerManager.register(new LineageListener)
      registered.add(session)
      true
    }
  }

  /** Id of the newest event (0 when none); pass it to `eventsSince` later. */
  def lastId(): Long = lastIdCounter.get()

  /** Events newer than `id`, oldest first, as a JSON array of objects. */
  def eventsSince(id: Long): String = buffer.synchronized {
    buffer.filter(_._1 > id).map(_._2).mkString("[", ",", "]")
  }

  /** Drop every event (tests). */
  def clear(): Unit = buffer.synchronized(buffer.clear())

  private[lineage] def record(funcName: String, plan: LogicalPlan, millis: Long): Unit = {
    val inputs = mutable.LinkedHashMap.empty[String, JValue]
    val outputs = mutable.ArrayBuffer.empty[JValue]
    plan.foreachWithSubqueries {
      case r: LogicalRelation =>
        r.relation match {
          case fs: HadoopFsRelation =>
            val table = r.catalogTable.map(_.identifier.unquotedString)
            val in = fileSource(fs.location, formatName(fs.fileFormat), table)
            inputs.getOrElseUpdate((in \ "paths").toString + table, in)
          case other =>
            val name = r.catalogTable.map(_.identifier.unquotedString).getOrElse(other.getClass.getName)
            inputs.getOrElseUpdate("relation:" + name, ("kind" -> "relation") ~ ("table" -> name) ~
              ("format" -> other.getClass.getSimpleName))
        }
      case h: HiveTableRelation =>
        val name = h.tableMeta.identifier.unquotedString
        inputs.getOrElseUpdate("table:" + name, ("kind" -> "table") ~ ("table" -> name) ~
          ("format" -> h.tableMeta.provider.getOrElse("hive")) ~
          ("paths" -> h.tableMeta.storage.locationUri.map(_.toString).toList))
      case v: DataSourceV2Relation =>
        val name = v.identifier.map(_.toString).getOrElse(v.table.name())
        inputs.getOrElseUpdate("v2:" + name, ("kind" -> "table") ~ ("table" -> name) ~
          ("format" -> v.table.getClass.getSimpleName))
      case w: InsertIntoHadoopFsRelationCommand =>
        outputs += ("kind" -> "files") ~ ("path" -> w.outputPath.toString) ~ ("format" -> formatName(w.fileFormat)) ~
          ("mode" -> w.mode.toString) ~ ("partition_columns" -> w.partitionColumns.map(_.name).toList) ~
          ("table" -> w.catalogTable.map(_.identifier.unquotedString))
      case _ =>
    }
    if (inputs.nonEmpty || outputs.nonEmpty) {
      buffer.synchronized {
        val id = lastIdCounter.incrementAndGet()
        val event: JObject = ("id" -> id) ~ ("time_ms" -> System.currentTimeMillis()) ~ ("action" -> funcName) ~
          ("duration_ms" -> millis) ~ ("inputs" -> JArray(inputs.values.toList)) ~ ("outputs" -> JArray(outputs.toList))
        buffer.enqueue((id, compact(render(event))))
        while (buffer.size > capacity) buffer.dequeue()
      }
    }
  }

  private def formatName(format: AnyRef): String = format match {
    case d: DataSourceRegister => d.shortName()
    case other => other.getClass.getSimpleName
  }

  private def fileSource(index: FileIndex, format: String, table: Option[String]): JObject = {
    val files: Seq[(String, Long, Long)] = index match {
      case p: PartitioningAwareFileIndex =>
        p.allFiles().map(f => (f.getPath.toString, f.getLen, f.getModificationTime)).sortBy(_._1)
      case other => other.inputFiles.toSeq.sorted.map(f => (f, -1L, -1L))
    }
    val sha = MessageDigest.getInstance("SHA-256")
    files.foreach { case (path, len, mtime) => sha.update(s"$path\t$len\t$mtime\n".getBytes(StandardCharsets.UTF_8)) }
    val digest = sha.digest().map(b => f"${b & 0xff}%02x").mkString
    ("kind" -> "files") ~ ("format" -> format) ~ ("paths" -> index.rootPaths.map(_.toString).toList) ~
      ("table" -> table) ~ ("files" -> files.size) ~ ("size_bytes" -> files.map(f => math.max(f._2, 0L)).sum) ~
      ("digest" -> digest)
  }
}
