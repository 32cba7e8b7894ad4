package io.sparktrain.lineage

import java.nio.charset.StandardCharsets
import java.security.MessageDigest
import java.util.concurrent.atomic.{AtomicInteger, AtomicLong}

import scala.collection.mutable
import scala.util.control.NonFatal

import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.catalog.HiveTableRelation
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan
import org.apache.spark.sql.execution.QueryExecution
import org.apache.spark.sql.execution.datasources.{FileIndex, HadoopFsRelation, InsertIntoHadoopFsRelationCommand,
  LogicalRelation, PartitioningAwareFileIndex}
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation
import org.apache.spark.sql.sources.DataSourceRegister
import org.apache.spark.sql.util.QueryExecutionListener
import org.json4s.JsonAST.{JArray, JNull, JObject, JString, JValue}
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods.{compact, render}
import org.slf4j.LoggerFactory

/**
 * Records what each successful query read and wrote: the data lineage of a job.
 *
 * While at least one recording is open (`begin` ... `end`), it keeps one event per action
 * (a `collect`, a `count`, a `write`...): the file sources the query read (format, root paths,
 * number of files, bytes, and a digest of the listing: path, length and modification time of
 * every file, for file indexes Spark has already listed), the catalog and DataSource V2 tables
 * it read, and the files it wrote (path, format, save mode), tagged with the session's `sessionId`.
 * No data is read and nothing is listed: everything comes from the analyzed plan and the file
 * index Spark built for the query.  With no recording open it does nothing.
 *
 * Events are JSON strings in a bounded buffer shared by the JVM (the newest `capacity` are kept;
 * each lists at most `maxPaths` root paths), numbered from 1.  The Python side
 * (`sparktrain.jvm`) registers the listener on a session with `register`, and reads the events
 * of one piece of work with `begin`, `lastId`, `eventsBetween` and `end`.
 *
 * Lineage never fails a query: a plan it cannot read is skipped with a warning.
 */
class LineageListener extends QueryExecutionListener {

  override def onSuccess(funcName: String, qe: QueryExecution, durationNs: Long): Unit = {
    if (LineageListener.recording) {
      try {
        LineageListener.record(funcName, LineageListener.sessionId(qe.sparkSession), qe.analyzed,
          durationNs / 1000000L)
      } catch {
        // A LinkageError (a jar built for another Spark) must not kill Spark's listener thread either.
        case e @ (NonFatal(_) | _: LinkageError) =>
          LineageListener.log.warn(s"sparktrain lineage: could not read the plan of '$funcName': $e")
      }
    }
  }

  override def onFailure(funcName: String, qe: QueryExecution, exception: Exception): Unit = ()
}

object LineageListener {
  /** The newest events kept. */
  val capacity: Int = 1000
  /** Root paths kept per source (a CSV schema inference can list every file); `paths_total` has the count. */
  val maxPaths: Int = 50

  private[lineage] val log = LoggerFactory.getLogger(classOf[LineageListener])
  private val lastIdCounter = new AtomicLong(0L)
  private val open = new AtomicInteger(0)
  private val buffer = mutable.Queue.empty[(Long, String)]
  private val registered = java.util.Collections.newSetFromMap(
    new java.util.WeakHashMap[SparkSession, java.lang.Boolean]())
  private val sessionIds = new java.util.WeakHashMap[SparkSession, String]()
  private val sessionCounter = new AtomicLong(0L)

  /** A JVM-unique id of `session`, the `session` field of its events. */
  def sessionId(session: SparkSession): String = sessionIds.synchronized {
    var id = sessionIds.get(session)
    if (id == null) {
      id = "s" + sessionCounter.incrementAndGet()
      sessionIds.put(session, id)
    }
    id
  }

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

  /** Open a recording: events are kept until every open recording has ended. */
  def begin(): Long = { open.incrementAndGet(); lastId() }

  /** Close a recording opened by `begin`. */
  def end(): Long = { open.updateAndGet(n => math.max(0, n - 1)); lastId() }

  /** Whether a recording is open. */
  def recording: Boolean = open.get() > 0

  /** Id of the newest event (0 when none). */
  def lastId(): Long = lastIdCounter.get()

  /** Oldest id still in the buffer (`lastId() + 1` when empty): events before it were dropped. */
  def firstId(): Long = buffer.synchronized(buffer.headOption.map(_._1).getOrElse(lastId() + 1))

  /** Events with `from < id <= to` of the session `session` (a `sessionId`; any when null), oldest first, as JSON. */
  def eventsBetween(from: Long, to: Long, session: String): String = buffer.synchronized {
    buffer.iterator.filter { case (id, _) => id > from && id <= to }.map(_._2)
      .filter(e => session == null || e.contains("\"session\":\"" + session + "\","))
      .mkString("[", ",", "]")
  }

  /** Drop every event (tests). */
  def clear(): Unit = buffer.synchronized(buffer.clear())

  private[lineage] def record(funcName: String, session: String, plan: LogicalPlan, millis: Long): Unit = {
    val inputs = mutable.LinkedHashMap.empty[String, () => JValue]
    val outputs = mutable.ArrayBuffer.empty[JValue]
    foreachWithSubqueries(plan) {
      case r: LogicalRelation =>
        val table = r.catalogTable.map(_.identifier.unquotedString)
        r.relation match {
          case fs: HadoopFsRelation =>
            val format = formatName(fs.fileFormat)
            val key = s"files:$format:${fs.location.rootPaths.mkString(",")}:${table.getOrElse("")}"
            inputs.getOrElseUpdate(key, () => fileSource(fs.location, format, table))
          case other =>
            val name = table.getOrElse(other.getClass.getName)
            inputs.getOrElseUpdate("relation:" + name, () => ("kind" -> "relation") ~ ("table" -> name) ~
              ("format" -> other.getClass.getSimpleName))
        }
      case h: HiveTableRelation =>
        val name = h.tableMeta.identifier.unquotedString
        inputs.getOrElseUpdate("table:" + name, () => ("kind" -> "table") ~ ("table" -> name) ~
          ("format" -> h.tableMeta.provider.getOrElse("hive")) ~
          ("paths" -> h.tableMeta.storage.locationUri.map(_.toString).toList))
      case v: DataSourceV2Relation =>
        val name = v.identifier.map(_.toString).getOrElse(v.table.name())
        inputs.getOrElseUpdate("v2:" + name, () => ("kind" -> "table") ~ ("table" -> name) ~
          ("format" -> v.table.getClass.getSimpleName))
      case w: InsertIntoHadoopFsRelationCommand =>
        outputs += ("kind" -> "files") ~ ("path" -> w.outputPath.toString) ~ ("format" -> formatName(w.fileFormat)) ~
          ("mode" -> w.mode.toString) ~ ("partition_columns" -> w.partitionColumns.map(_.name).toList) ~
          ("table" -> w.catalogTable.map(_.identifier.unquotedString))
      case _ =>
    }
    if (inputs.nonEmpty || outputs.nonEmpty) {
      val read = JArray(inputs.values.map(_.apply()).toList)  // digests outside the buffer's lock
      buffer.synchronized {
        val id = lastIdCounter.incrementAndGet()
        val event: JObject = ("id" -> id) ~ ("session" -> session) ~ ("time_ms" -> System.currentTimeMillis()) ~
          ("action" -> funcName) ~ ("duration_ms" -> millis) ~ ("inputs" -> read) ~ ("outputs" -> JArray(outputs.toList))
        buffer.enqueue((id, compact(render(event))))
        while (buffer.size > capacity) buffer.dequeue()
      }
    }
  }

  /** Every node of `plan` and, right after each node, of its subqueries: `QueryPlan.foreachWithSubqueries` of
   * Spark 4, which Spark 3.5 lacks (the same jar sources build for Scala 2.12 / Spark 3.5 and 2.13 / Spark 4). */
  private def foreachWithSubqueries(plan: LogicalPlan)(f: LogicalPlan => Unit): Unit =
    plan.foreach { node => f(node); node.subqueries.foreach(foreachWithSubqueries(_)(f)) }

  private def formatName(format: AnyRef): String = format match {
    case d: DataSourceRegister => d.shortName()
    case other => other.getClass.getSimpleName
  }

  /** A file source.  Only an index Spark has already listed gets files, bytes and a digest: nothing is listed here. */
  private def fileSource(index: FileIndex, format: String, table: Option[String]): JObject = {
    val roots = index.rootPaths.map(_.toString)
    val base = ("kind" -> "files") ~ ("format" -> format) ~ ("paths" -> roots.take(maxPaths).toList) ~
      ("paths_total" -> roots.size) ~ ("table" -> table)
    index match {
      case p: PartitioningAwareFileIndex =>
        val files = p.allFiles().map(f => (f.getPath.toString, f.getLen, f.getModificationTime)).sortBy(_._1)
        val sha = MessageDigest.getInstance("SHA-256")
        files.foreach { case (path, len, mtime) => sha.update(s"$path\t$len\t$mtime\n".getBytes(StandardCharsets.UTF_8)) }
        base ~ ("files" -> files.size) ~ ("size_bytes" -> files.map(_._2).sum) ~
          ("digest" -> JString(sha.digest().map(b => f"${b & 0xff}%02x").mkString))
      case _ =>
        base ~ ("digest" -> JNull)
    }
  }
}
