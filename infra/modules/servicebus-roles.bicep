// Data-plane roles on the Service Bus entities, each scoped to the one entity it is needed on
// (never the namespace): what each identity may do is exactly what its code does.

@description('Name of the Service Bus namespace.')
param namespaceName string

@description('Name of the scheduled-events topic.')
param topicName string

@description('Name of the approvals queue.')
param approvalsQueueName string

@description('Name of the queue lb-pools schedules its drain moments on.')
param drainMomentsQueueName string

@description('Principal id of the Function App identity.')
param functionAppPrincipalId string

@description('Subscriptions the Function App receives from (its triggers), and nothing else.')
param functionAppSubscriptionNames array

@description('Principal id of the forwarders\' user-assigned identity.')
param forwarderPrincipalId string

@description('Object ids of the users, groups or service principals who send approve commands by hand (sebridge approve): Data Sender on the approvals queue, nothing else.')
param approvalSenderPrincipalIds array = []

// Azure Service Bus Data Receiver
var serviceBusDataReceiver = '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
// Azure Service Bus Data Sender
var serviceBusDataSender = '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'

resource namespace 'Microsoft.ServiceBus/namespaces@2022-10-01-preview' existing = {
  name: namespaceName
}

resource topic 'Microsoft.ServiceBus/namespaces/topics@2022-10-01-preview' existing = {
  parent: namespace
  name: topicName
}

resource approvalsQueue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' existing = {
  parent: namespace
  name: approvalsQueueName
}

resource drainMomentsQueue 'Microsoft.ServiceBus/namespaces/queues@2022-10-01-preview' existing = {
  parent: namespace
  name: drainMomentsQueueName
}

resource appSubscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2022-10-01-preview' existing = [for name in functionAppSubscriptionNames: {
  parent: topic
  name: name
}]

// Azure Service Bus Data Receiver: the Function App's triggers, one assignment per subscription.
resource appReceivesSubscription 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in functionAppSubscriptionNames: {
  scope: appSubscriptions[i]
  name: guid(appSubscriptions[i].id, functionAppPrincipalId, serviceBusDataReceiver)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}]

// Azure Service Bus Data Sender: lb-pools publishes Prepared to the topic.
resource appSendsTopic 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: topic
  name: guid(topic.id, functionAppPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Azure Service Bus Data Sender: approval-gate sends approve commands.
resource appSendsApprovals 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: approvalsQueue
  name: guid(approvalsQueue.id, functionAppPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Azure Service Bus Data Sender: lb-pools schedules (and cancels) its drain moments; on this
// queue only, which nobody else may send to.
resource appSchedulesDrains 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: drainMomentsQueue
  name: guid(drainMomentsQueue.id, functionAppPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Azure Service Bus Data Receiver: the drain_moment trigger receives the due drains.
resource appReceivesDrains 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: drainMomentsQueue
  name: guid(drainMomentsQueue.id, functionAppPrincipalId, serviceBusDataReceiver)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Azure Service Bus Data Sender: forwarders publish lifecycle transitions.
resource forwarderSendsTopic 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: topic
  name: guid(topic.id, forwarderPrincipalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: forwarderPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Azure Service Bus Data Receiver: forwarders receive approve commands (session = VM name).
resource forwarderReceivesApprovals 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: approvalsQueue
  name: guid(approvalsQueue.id, forwarderPrincipalId, serviceBusDataReceiver)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataReceiver)
    principalId: forwarderPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Azure Service Bus Data Sender: operators who send approve commands by hand (sebridge approve),
// on the approvals queue only (they may not publish transitions to the topic, nor read anything).
resource operatorsSendApprovals 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for principalId in approvalSenderPrincipalIds: {
  scope: approvalsQueue
  name: guid(approvalsQueue.id, principalId, serviceBusDataSender)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', serviceBusDataSender)
    principalId: principalId
  }
}]
